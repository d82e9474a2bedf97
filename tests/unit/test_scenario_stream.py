"""The generated step stream is part of the contract: a campaign seed, a recorded "found at step N" and a
reproducer's seed mean the same steps only while `random_steps` and `sample_lengths` draw the same values. These
digests pin the stream (a change to either is a deliberate, documented break, and the pinned values change with it)."""

from __future__ import annotations

import hashlib

from flashcheck.fuzzing.distributions import DISTRIBUTIONS, sample_lengths
from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.targets.registry import make_target


def _digest(items: list[object]) -> str:
    return hashlib.sha256(repr(items).encode()).hexdigest()[:16]


def test_random_steps_stream_is_stable() -> None:
    got = []
    for name in ("decode-tc", "cpu-reference", "prefill-fa2", "batch-attention"):
        cap = make_target(name).capacity
        for seed in (0, 7919, 2026):
            steps = random_steps(cap, 200, seed, capture_first=seed != 7919)
            got.append([(s.op, s.qo_lens, s.kv_lens, s.bucket, s.seed, s.allocator) for s in steps])
    assert all(type(x) is int for s in got[0] for x in s[2])  # plain ints, as steps are recorded
    assert _digest(got) == STEPS_DIGEST


def test_sample_lengths_stream_is_stable() -> None:
    got = []
    for dist in DISTRIBUTIONS:
        for seed in range(25):
            for bs, max_kv in ((1, 8), (3, 100), (17, 4096)):
                qo, kv = sample_lengths(dist, bs, seed, max_kv=max_kv, page_size=16)
                assert qo.dtype.str == kv.dtype.str == "<i8"
                got.append((qo.tolist(), kv.tolist()))
    assert _digest(got) == LENGTHS_DIGEST


STEPS_DIGEST = "855dab3874fe8435"
LENGTHS_DIGEST = "6b428e71721ce5e6"
