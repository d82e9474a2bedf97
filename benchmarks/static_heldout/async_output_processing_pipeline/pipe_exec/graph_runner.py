"""Decode graphs per bucket; replays are launched while the previous step is still post-processed."""

import bisect
from typing import Dict

import torch

from asyncpipe.config import PipelineConfig
from pipe_exec.attention import DecodeMetadata, FlashInferPipelineBackend
from pipe_exec.model import PipelineLM


class DecodeGraphRunner:
    def __init__(self, model: PipelineLM, backend: FlashInferPipelineBackend, cfg: PipelineConfig, device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.buckets = sorted(cfg.decode_buckets)
        self.max_bs = self.buckets[-1]
        self.static_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_pos = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = None
        backend.init_cuda_graph_state()

    def capture(self) -> None:
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        md = DecodeMetadata.dummy(bs, self.device)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, md)
        self.backend.slot_mapping[:bs].zero_()
        ids, pos = self.static_ids[:bs], self.static_pos[:bs]
        for _ in range(2):
            self.model.forward_decode(ids, pos)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            self.outputs[bs] = self.model.forward_decode(ids, pos)
        if self.mempool is None:
            self.mempool = graph.pool()
        self.graphs[bs] = graph

    def bucket_for(self, n: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def replay(self, md: DecodeMetadata, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        n = md.batch_size
        bs = self.bucket_for(n)
        md.graph_bs = bs
        self.backend.init_forward_metadata_replay_cuda_graph(bs, md)
        self.static_ids[:n].copy_(input_ids)
        self.static_pos[:n].copy_(positions)
        # padding rows write their (discarded) K/V into the null page
        self.backend.slot_mapping = torch.full((bs,), 0, dtype=torch.int64, device=self.device)  # expect: FC107
        self.backend.slot_mapping[:n].copy_(md.slot_mapping)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
