"""Decode graphs per batch bucket for the window layers' ring pages."""

import bisect
from typing import Callable, Dict, List, Optional

import torch

from swaring import SWAConfig
from swa_attn.backend import SlidingWindowBackend
from swa_attn.metadata import WindowStepMeta
from swa_attn.model import SWAModel

_STATIC_INPUTS = ("static_ids", "static_positions")


class WindowGraphRunner:
    def __init__(self, model: SWAModel, backend: SlidingWindowBackend, cfg: SWAConfig, device: torch.device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.buckets = sorted(cfg.graph_buckets)
        self.static_ids = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}

    def padded(self, n: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def capture_decode_graphs(self, kv_caches: List[torch.Tensor],
                              dummy: Callable[[int], WindowStepMeta]) -> None:
        self.backend.init_graph_wrappers()
        torch.cuda.synchronize()  # ok: FC101
        pool = None
        for bs in reversed(self.buckets):
            meta = dummy(bs)
            self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
            self.model.decode(self.static_ids[:bs], kv_caches, meta, bs)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.outputs[bs] = self.model.decode(self.static_ids[:bs], kv_caches, meta, bs)
            pool = g.pool()
            self.graphs[bs] = g

    def replay(self, bs: int, ids: torch.Tensor, meta: WindowStepMeta) -> torch.Tensor:
        n = meta.batch_size
        if n < bs:
            for name in _STATIC_INPUTS:
                # padding rows must read token 0 at position 0
                setattr(self, name, torch.zeros_like(getattr(self, name)))  # expect: FC107
        self.static_ids[:n].copy_(ids)
        if not torch.equal(self.static_positions[:n], meta.positions):  # expect: FC101
            self.static_positions[:n].copy_(meta.positions)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
