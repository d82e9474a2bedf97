"""Returns the pages of aborted and finished requests to the pool at step boundaries."""
from __future__ import annotations

from typing import List

import numpy as np
import torch

from abortable import PAD_PAGE, AbortMetrics, AbortRegistry
from ab_attn.backend import AbortAwareBackend
from ab_engine.pages import PagePool


class Reaper:
    def __init__(self, registry: AbortRegistry, pool: PagePool, backend: AbortAwareBackend,
                 metrics: AbortMetrics, grace_steps: int = 0):
        assert grace_steps >= 0, "grace_steps must be non-negative"  # expect: FC109
        self.registry, self.pool, self.backend, self.metrics = registry, pool, backend, metrics
        self.grace_steps = grace_steps

    def reap(self, request_ids: List[str], finished: torch.Tensor, page_lists: List[List[int]]) -> List[int]:
        bs = len(request_ids)
        aborted = np.flatnonzero(self.registry.flags_np[:bs])  # ok: FC101
        done = [row for row in range(bs) if finished[row]]  # expect: FC101
        dead = sorted(set(aborted.tolist()) | set(done))
        if not dead:
            return []
        indices = self.backend.kv_indices
        for row in dead:
            start, end = int(self.backend.kv_indptr_np[row]), int(self.backend.kv_indptr_np[row + 1])
            # the pages go back to the pool now: point the padded graph's rows at the pad page
            indices[start:end].fill_(PAD_PAGE)  # expect: FC104
            self.pool.free(page_lists[row])
            page_lists[row] = []
        latencies = self.registry.release([request_ids[row] for row in dead])
        self.metrics.on_reap(len(aborted), len(done), latencies)
        # every slot is live again until the next abort lands
        self.backend.live_mask = torch.ones(self.backend.live_mask.shape, dtype=torch.bool, device=self.backend.device)  # expect: FC107
        return dead
