from __future__ import annotations

from typing import Dict, List, Optional

import torch

from kg_attn.backend import ScannerBackend
from kvguard import IntegrityConfig

from .model import GuardedLlama


class DecodeGraphs:
    def __init__(self, model: GuardedLlama, backend: ScannerBackend, cfg: IntegrityConfig,
                 device: torch.device) -> None:
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.buckets = sorted(cfg.buckets)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.static_ids = torch.zeros(cfg.max_batch, dtype=torch.long, device=device)
        self.static_pos = torch.zeros(cfg.max_batch, dtype=torch.long, device=device)
        self.replay_counts_gpu = torch.zeros(len(self.buckets), dtype=torch.int64, device=device)

    def bucket_for(self, n: int) -> Optional[int]:
        return next((b for b in self.buckets if b >= n), None)

    def record_buckets(self, kv_cache: torch.Tensor) -> None:
        pool = None
        for bs in reversed(self.buckets):
            self.backend.plan_capture(bs)
            self.model(self.static_ids[:bs], self.static_pos[:bs], kv_cache)
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.outputs[bs] = self.model(self.static_ids[:bs], self.static_pos[:bs], kv_cache)
            pool = g.pool()
            self.graphs[bs] = g

    def launch(self, bs: int) -> torch.Tensor:
        self.graphs[bs].replay()
        self.replay_counts_gpu[self.buckets.index(bs)] += 1
        return self.outputs[bs]

    def replay_report(self) -> List[int]:
        return self.replay_counts_gpu.tolist()  # ok: FC101
