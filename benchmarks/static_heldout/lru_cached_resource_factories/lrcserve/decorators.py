"""Decorators around step functions: timing, NVTX ranges, OOM retry, graph-row padding.

All of them keep the wrapped function's name and docstring (functools.wraps) so that
profiles, logs and the metrics exporter show the engine's names, not `wrapper`.
"""
from __future__ import annotations

import collections
import functools
import logging
import statistics
import time
from typing import Callable, TypeVar

import torch

from . import envs

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable)

_STEP_TIMES: dict[str, collections.deque] = collections.defaultdict(
    lambda: collections.deque(maxlen=envs.STEP_TIMING_WINDOW)
)


def step_timer(phase: str) -> Callable[[F], F]:
    """Record the wall time of every call under `phase` (p50/p99 go to the metrics thread).

    The GPU runs ahead of the host, so the timer waits for it: without the barrier the
    numbers would only say how long it takes to enqueue the kernels.
    """

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()  # expect: FC101
            _STEP_TIMES[phase].append(time.perf_counter() - start)
            return out

        return timed  # type: ignore[return-value]

    return deco


def phase_timer(phase: str) -> Callable[[F], F]:
    """Time one-off phases (weight loading, graph capture) and log them once."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()  # ok: FC101
            logger.info("%s took %.2f s", phase, time.perf_counter() - start)
            return out

        return timed  # type: ignore[return-value]

    return deco


def nvtx_range(label: str) -> Callable[[F], F]:
    """Wrap a `(self, batch, ...)` step in an NVTX range named after the batch shape."""

    def deco(fn: F) -> F:
        if not envs.ENABLE_NVTX:
            return fn

        @functools.wraps(fn)
        def ranged(self, batch, *args, **kwargs):
            torch.cuda.nvtx.range_push(f"{label} bs={batch.batch_size} max_len={batch.max_seq_len_host}")  # ok: FC101
            try:
                return fn(self, batch, *args, **kwargs)
            finally:
                torch.cuda.nvtx.range_pop()

        return ranged  # type: ignore[return-value]

    return deco


def retry_on_oom(times: int = envs.OOM_RETRIES) -> Callable[[F], F]:
    """Retry a step after dropping the lazily rebuilt cached resources on CUDA OOM."""
    assert times >= 1, "retry_on_oom needs at least one attempt"  # expect: FC109

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def retried(*args, **kwargs):
            for attempt in range(times):
                try:
                    return fn(*args, **kwargs)
                except torch.cuda.OutOfMemoryError:
                    if attempt + 1 == times:
                        raise
                    logger.warning(
                        "OOM in %s; dropping cached resources (attempt %d of %d)",
                        fn.__qualname__, attempt + 1, times,
                    )
                    from .resources import release_cached_resources

                    release_cached_resources()
                    torch.cuda.empty_cache()
            raise RuntimeError(f"{fn.__qualname__}: no attempt left")

        return retried  # type: ignore[return-value]

    return deco


def pad_graph_rows(fn: F) -> F:
    """After replay preparation, make the padded rows of a bucket look like 1-token rows.

    Wraps `init_forward_metadata_replay_cuda_graph(self, bs, raw_bs, ...)`.
    """

    @functools.wraps(fn)
    def padded(self, bs, raw_bs, *args, **kwargs):
        out = fn(self, bs, raw_bs, *args, **kwargs)
        if raw_bs < bs:
            self.g_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        return out

    return padded  # type: ignore[return-value]


def timing_summary() -> dict[str, dict[str, float]]:
    out = {}
    for phase, samples in _STEP_TIMES.items():
        if len(samples) < 2:
            continue
        qs = statistics.quantiles(samples, n=100)
        out[phase] = {"p50_ms": qs[49] * 1e3, "p99_ms": qs[98] * 1e3, "n": float(len(samples))}
    return out
