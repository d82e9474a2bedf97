"""Decode graphs on the decode GPU, captured into that device's own memory pool and stream."""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import torch

from hgs.config import ClusterConfig
from hgs.devices import DeviceContext
from hgs.model import HeteroLM
from hgs_decode.attention import DecodeAttention, DecodeMeta


class DecodeGraphPool:
    def __init__(self, model: HeteroLM, attn: DecodeAttention, ctx: DeviceContext, cfg: ClusterConfig):
        self.model = model
        self.attn = attn
        self.ctx = ctx
        self.cfg = cfg
        dev = ctx.device
        max_bs = max(cfg.decode_buckets)
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.static_out_loc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.capture_positions: Dict[int, torch.Tensor] = {}

    def capture_all(self, make_meta: Callable[[int], DecodeMeta]) -> None:
        for bs in sorted(self.cfg.decode_buckets, reverse=True):
            self.capture_bucket(bs, make_meta(bs))

    def capture_bucket(self, bs: int, meta: DecodeMeta) -> None:
        with torch.cuda.device(self.ctx.device):
            self.attn.prepare_replay(bs, meta)
            # kept for the debug dump: which positions the graph was recorded with
            self.capture_positions[bs] = self.static_positions[:bs].cpu()  # expect: FC101
            torch.cuda.synchronize(self.ctx.device)  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.ctx.graph_pool, stream=self.ctx.compute_stream):
                self.outputs[bs] = self.model.decode(
                    self.static_ids[:bs], self.static_positions[:bs], self.static_out_loc[:bs], self.attn, bs, meta
                )
            self.graphs[bs] = g

    def replay(self, bs: int, meta: DecodeMeta) -> Tuple[torch.Tensor, torch.Tensor]:
        n = meta.num_reqs
        self.static_ids[:n].copy_(meta.input_ids)
        self.static_positions[:n].copy_(meta.positions)
        self.static_out_loc[:n].copy_(meta.out_loc)
        self.static_out_loc[n:bs].zero_()
        self.graphs[bs].replay()
        logits, draft = self.outputs[bs]
        return logits[:n], draft[:n]

    def replay_debug_dump(self, bs: int) -> Dict[str, object]:
        """Served by the admin endpoint: what the bucket's graph last read."""
        return {
            "bucket": bs,
            "first_page": self.attn.indices_buf[0].item(),  # ok: FC101
            "captured_positions": self.capture_positions.get(bs),
        }
