"""Verify graphs keyed by (batch, tree size); the first draft level of the next step is recorded with them."""

from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import torch

from .batch import SpecForwardBatch
from .drafter import Eagle2Config, Eagle2Drafter
from .tree import DynamicTree
from .verify_backend import TreeVerifyBackend

Key = Tuple[int, int]


class VerifyGraphRunner:
    def __init__(self, cfg: Eagle2Config, target, drafter: Eagle2Drafter, backend: TreeVerifyBackend,
                 kv_caches: List[torch.Tensor], device: torch.device) -> None:
        self.cfg, self.target, self.drafter, self.backend, self.kv_caches = cfg, target, drafter, backend, kv_caches
        n = cfg.max_bs * max(cfg.tree_sizes)
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.tree_positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.graphs: Dict[Key, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[Key, torch.Tensor] = {}
        self.next_level: Dict[Key, Tuple[torch.Tensor, torch.Tensor]] = {}

    def run_eager(self, w, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.target.embed(self.input_ids[:n], self.tree_positions[:n])
        for layer, kv in zip(self.target.layers, self.kv_caches):
            h = layer.finish(w.run(layer.q_proj(h), kv), h)  # ok: FC108
        return self.target.lm_head(h), h

    def record_bucket(self, bs: int, ts: int, fb: SpecForwardBatch, tree: DynamicTree) -> None:
        w = self.backend.verify_wrappers[(bs, ts)]
        if not w.is_cuda_graph_enabled:  # ok: FC103
            raise RuntimeError(f"verify wrapper ({bs}, {ts}) is not in graph mode")
        if w._paged_kv_indptr_buf.numel() != bs + 1:  # expect: FC103
            raise RuntimeError(f"verify wrapper ({bs}, {ts}) bound to a buffer of another batch size")
        self.backend.prepare_verify(bs, ts, fb, tree)
        self.drafter.plan_levels(fb)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits, h = self.run_eager(w, bs * ts)
            # EAGLE fuses the next step's first draft level into the verify graph
            nxt = self.drafter.draft_level(0, logits.argmax(-1), h, fb.draft_kv_cache)
        self.graphs[(bs, ts)], self.logits[(bs, ts)], self.next_level[(bs, ts)] = graph, logits, nxt

    def record_all(self, make_dummy: Callable[[int, int], Tuple[SpecForwardBatch, DynamicTree]]) -> None:
        for bs, ts in self.backend.buckets:
            self.record_bucket(bs, ts, *make_dummy(bs, ts))

    def replay(self, key: Key) -> torch.Tensor:
        self.graphs[key].replay()
        return self.logits[key]
