"""Chooses the set of captured decode buckets from the observed batch sizes and the TPOT headroom."""

from typing import Dict, Protocol, Tuple

import numpy as np
import torch

from .config import SLOConfig
from .metrics import MetricsRegistry


class BucketPool(Protocol):
    buckets: Tuple[int, ...]

    def probe_latency(self, bs: int) -> float: ...

    def rebuild_buckets(self, buckets: Tuple[int, ...]) -> None: ...


class BucketAutoscaler:
    def __init__(self, cfg: SLOConfig, pool: BucketPool, registry: MetricsRegistry):
        self.cfg = cfg
        self.pool = pool
        self.steps = 0
        self.batch_hist = np.zeros(cfg.max_batch + 1, dtype=np.int64)
        self.occupancy_window = torch.zeros(cfg.rescale_every, dtype=torch.int32)
        self.probe_ms: Dict[int, float] = {}
        self.rescales = registry.counter("bucket_rescales_total")
        self.graphs_gauge = registry.gauge("captured_buckets")

    def record(self, bs: int, active: int) -> None:
        self.batch_hist[bs] += 1
        self.occupancy_window[self.steps % self.cfg.rescale_every] = active
        self.steps += 1

    def maybe_rescale(self, tpot_p99_ms: float) -> bool:
        if self.steps % self.cfg.rescale_every:
            return False
        active_total = int(self.occupancy_window.sum())  # ok: FC101
        if active_total == 0:
            return False
        for bs in self.pool.buckets:
            self.probe_ms[bs] = self.pool.probe_latency(bs)
        headroom = self.cfg.tpot_ms - tpot_p99_ms
        new = self.decide(self.batch_hist, headroom)
        if new == tuple(self.pool.buckets):
            return False
        self.apply(new)
        return True

    def decide(self, batch_hist: np.ndarray, headroom_ms: float) -> Tuple[int, ...]:
        """Cover the sizes seen most often; with little headroom, add finer buckets (less padding)."""
        cands = np.array(self.cfg.candidate_buckets)
        waste = np.zeros(len(cands))
        for size in np.flatnonzero(batch_hist):
            idx = np.searchsorted(cands, size)
            if idx < len(cands):
                waste[idx] += batch_hist[size] * (cands[idx] - size)
        budget = self.cfg.max_graphs if headroom_ms < 0.2 * self.cfg.tpot_ms else self.cfg.max_graphs // 2
        chosen = set(cands[np.argsort(-waste)[:budget]].tolist())
        chosen.add(int(cands[np.searchsorted(cands, np.flatnonzero(batch_hist).max())]))
        return tuple(sorted(chosen))

    def apply(self, new_buckets: Tuple[int, ...]) -> None:
        assert max(new_buckets) <= self.cfg.max_batch, "bucket beyond max_batch"  # expect: FC109
        self.pool.rebuild_buckets(new_buckets)
        self.rescales.inc()
        self.graphs_gauge.set(len(new_buckets))
