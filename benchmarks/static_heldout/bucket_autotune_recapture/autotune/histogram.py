"""Batch-size traffic histogram and the bucket choice that minimises expected padding."""

from typing import List

import numba
import numpy as np


@numba.njit(cache=True)
def smooth_counts(counts, width):
    assert width > 0  # ok: FC109
    n = counts.shape[0]
    out = np.zeros_like(counts)
    for i in range(n):
        lo = max(0, i - width)
        hi = min(n, i + width + 1)
        out[i] = counts[lo:hi].mean()
    return out


class TrafficHistogram:
    def __init__(self, max_batch: int, decay: float = 0.9995):
        self.counts_np = np.zeros(max_batch + 1, dtype=np.float64)
        self.decay = decay
        self.observed = 0

    def observe(self, bs: int) -> None:
        self.counts_np *= self.decay
        self.counts_np[bs] += 1.0
        self.observed += 1

    def padded_waste(self, buckets: List[int]) -> float:
        """Expected fraction of padded rows if every batch runs in the smallest bucket that holds it."""
        total = self.counts_np.sum()
        if total == 0.0:
            return 0.0
        sizes = np.arange(self.counts_np.shape[0])
        edges = np.asarray(sorted(buckets))
        idx = np.searchsorted(edges, sizes)
        padded = np.where(idx < edges.size, edges[np.minimum(idx, edges.size - 1)], sizes)
        waste = (padded - sizes) * self.counts_np
        return float(waste[1:].sum() / max(1.0, (padded * self.counts_np)[1:].sum()))


def choose_buckets(counts: np.ndarray, k: int, max_bs: int) -> List[int]:
    """k bucket sizes (the largest is always max_bs) minimising expected padded rows, by dynamic programming."""
    assert k >= 1, "need at least one bucket"  # expect: FC109
    n = max_bs
    csum = np.concatenate([[0.0], np.cumsum(counts[1 : n + 1])])
    wsum = np.concatenate([[0.0], np.cumsum(counts[1 : n + 1] * np.arange(1, n + 1))])

    def cost(lo: int, hi: int) -> float:
        # batches of size lo+1..hi padded to hi
        return hi * (csum[hi] - csum[lo]) - (wsum[hi] - wsum[lo])

    inf = float("inf")
    best = np.full((k + 1, n + 1), inf)
    arg = np.zeros((k + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for j in range(1, k + 1):
        for hi in range(1, n + 1):
            for lo in range(0, hi):
                c = best[j - 1, lo] + cost(lo, hi)
                if c < best[j, hi]:
                    best[j, hi] = c
                    arg[j, hi] = lo
    j = int(np.argmin(best[1:, n])) + 1
    out, hi = [], n
    while j > 0 and hi > 0:
        out.append(hi)
        hi = int(arg[j, hi])
        j -= 1
    return sorted(out)
