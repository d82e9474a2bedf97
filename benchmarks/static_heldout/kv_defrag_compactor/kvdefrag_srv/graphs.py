"""One decode graph per bucket, captured once at start-up and replayed every step."""

from typing import Dict

import torch

from kvdefrag.config import DefragConfig
from kvdefrag.remap import RemapTable
from kvdefrag_srv.attention import DefragAttention
from kvdefrag_srv.model import DefragDecoder


class DecodeGraphRunner:
    def __init__(
        self,
        cfg: DefragConfig,
        model: DefragDecoder,
        attn: DefragAttention,
        remap: RemapTable,
        copy_stream: torch.cuda.Stream,
        device: torch.device,
    ):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.remap = remap
        self.copy_stream = copy_stream
        self.device = device
        max_bs = cfg.max_batch
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.capture_hint: Dict[int, int] = {}
        self.mempool = torch.cuda.graph_pool_handle()

    def graph_bucket(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.capture_hint[bs] = self.static_seq_lens[:bs].max().item()  # expect: FC101
        self.attn.ready_bucket(bs)
        for _ in range(2):
            self.model.forward_decode(self.static_input_ids[:bs], self.static_positions[:bs], bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            out = self.model.forward_decode(self.static_input_ids[:bs], self.static_positions[:bs], bs)
        self.graphs[bs] = g
        self.outputs[bs] = out

    def graph_all(self) -> None:
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.graph_bucket(bs)

    def replay(self, bs: int, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[0]
        if (self.remap.pending_gpu != 0).any():  # expect: FC101
            # a compaction pass is still copying: the graph must not read the destination pages early
            torch.cuda.current_stream().wait_stream(self.copy_stream)
        if n > self.static_positions.numel():
            self.static_positions = torch.zeros(n, dtype=torch.int64, device=self.device)  # expect: FC107
        self.static_input_ids[:n].copy_(input_ids)
        self.static_positions[:n].copy_(positions)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
