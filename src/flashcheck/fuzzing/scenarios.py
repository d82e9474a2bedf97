"""Random replay scenarios generated in bulk with numpy (the campaign's fast path; Hypothesis state machines in
`fuzz.stateful` draw the same kind of steps with shrinking).
"""

from __future__ import annotations

import numpy as np

from flashcheck.errors import InvalidArgument
from flashcheck.fuzzing.distributions import DISTRIBUTIONS, sample_lengths
from flashcheck.scenario import Step
from flashcheck.targets.protocol import Capacity

__all__ = ["fit_lengths", "random_steps"]


def fit_lengths(cap: Capacity, qo: np.ndarray, kv: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Clip generated lengths into what `cap` accepts: qo <= max_qo_len, kv <= max_kv_len, pages fit the pool."""
    qo = np.minimum(np.maximum(qo, 1), cap.max_qo_len)  # np.clip's values, without its Python-level overhead
    kv = np.minimum(np.maximum(np.maximum(kv, qo), 1), cap.max_kv_len)
    page = cap.template.page_size
    budget = cap.max_pages - 2  # one spare page for padding rows
    pages = -(-kv // page)
    while pages.sum() > budget:
        shorter = np.maximum(qo, kv // 2)
        if np.array_equal(shorter, kv):  # every request is down to its query length: the pool cannot hold it
            raise InvalidArgument(
                f"{len(kv)} requests need at least {int(pages.sum())} pages; the pool has {budget} "
                f"(max_pages={cap.max_pages}): draw fewer requests or a bigger pool"
            )
        kv = shorter
        pages = -(-kv // page)
    total_qo = int(qo.sum())
    if total_qo > cap.max_total_qo:
        qo = np.minimum(qo, max(1, cap.max_total_qo // len(qo)))
    return tuple(qo.tolist()), tuple(kv.tolist())


def random_steps(
    cap: Capacity, n: int, seed: int, *, dists: tuple[str, ...] = DISTRIBUTIONS, capture_first: bool = True
) -> list[Step]:
    """`n` steps: every bucket captured first (as engines do at start-up), then replays of random real batch
    sizes below their bucket, eager steps and occasional re-captures."""
    rng = np.random.default_rng(seed)
    steps: list[Step] = []
    max_kv = min(cap.max_kv_len, max(8, (cap.max_pages - 2) * cap.template.page_size // max(1, cap.max_batch_size)))

    def batch(bs: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        s = int(rng.integers(1 << 31))
        dist = dists[int(rng.integers(0, len(dists)))]  # the draw of rng.choice(dists), without an array
        qo, kv = sample_lengths(dist, bs, s, max_kv=max(8, max_kv), page_size=cap.template.page_size)
        q, k = fit_lengths(cap, qo, kv)
        return q, k, s

    allocs = ("contiguous", "shuffled", "fragmented")
    if cap.buckets and capture_first:
        for b in cap.buckets:
            q, k, s = batch(b)
            steps.append(Step("capture", q, k, bucket=b, seed=s, allocator="shuffled"))
    while len(steps) < n:
        r = rng.random()
        alloc = allocs[int(rng.integers(0, len(allocs)))]
        if cap.buckets and r < 0.65:
            bs = int(rng.integers(1, cap.buckets[-1] + 1))
            q, k, s = batch(bs)
            steps.append(Step("replay", q, k, seed=s, allocator=alloc))
        elif cap.buckets and r < 0.7:
            b = cap.buckets[int(rng.integers(0, len(cap.buckets)))]
            q, k, s = batch(int(rng.integers(1, b + 1)))
            steps.append(Step("capture", q, k, bucket=b, seed=s, allocator=alloc))
        else:
            q, k, s = batch(int(rng.integers(1, cap.max_batch_size + 1)))
            steps.append(Step("eager", q, k, seed=s, allocator=alloc))
    return steps[:n]
