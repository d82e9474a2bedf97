"""Decode graphs per batch bucket; the forced-end mask is a graph input."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from reasoning.config import ReasoningConfig
from rb_attn.backend import BatchMeta, ReasoningAttnBackend
from rb_run.model import ReasoningLM


class BucketGraphRunner:
    _RESET_EACH_REPLAY: Tuple[str, ...] = ("static_forced_mask",)

    def __init__(self, cfg: ReasoningConfig, backend: ReasoningAttnBackend, model: ReasoningLM,
                 device: torch.device):
        self.cfg = cfg
        self.backend = backend
        self.model = model
        self.max_bs = cfg.largest_bucket
        self.static_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_forced_mask = torch.zeros(self.max_bs, dtype=torch.bool, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.outputs[bs] = self.model.forward_decode(
                self.static_ids[:bs], self.static_positions[:bs], self.static_forced_mask[:bs]
            )
        self.pool = g.pool()
        self.graphs[bs] = g

    def capture_all(self) -> None:
        for bs in reversed(self.cfg.buckets):
            self.capture_one_batch_size(bs)

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: BatchMeta,
               forced_mask: torch.Tensor) -> torch.Tensor:
        real_bs = meta.batch_size
        bs = next(b for b in self.cfg.buckets if b >= real_bs)
        for name in self._RESET_EACH_REPLAY:
            setattr(self, name, getattr(self, name).new_zeros(self.max_bs))  # expect: FC107
        self.static_ids[:real_bs].copy_(input_ids, non_blocking=True)
        self.static_positions[:real_bs].copy_(positions, non_blocking=True)
        self.static_forced_mask[:real_bs].copy_(forced_mask)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
        self.graphs[bs].replay()
        return self.outputs[bs][:real_bs]
