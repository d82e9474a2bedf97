"""Decorators and counters, all closures: timing, CUDA-event timing, OOM retry, inference mode, step stats."""

from __future__ import annotations

import collections
import functools
import time
from typing import Callable

import torch


def timed(name: str):
    """Wall-clock time of the wrapped call, GPU work included."""

    def deco(fn):
        calls = 0
        total_s = 0.0

        @functools.wraps(fn)
        def timed_call(*args, **kwargs):
            nonlocal calls, total_s
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()  # expect: FC101
            total_s += time.perf_counter() - t0
            calls += 1
            return out

        timed_call.summary = lambda: {"name": name, "calls": calls, "total_s": total_s}
        return timed_call

    return deco


def cuda_timed(name: str, window: int = 256):
    """Records a pair of CUDA events around each call; ``report()`` reads them later, off the step."""

    def deco(fn):
        pairs: collections.deque = collections.deque(maxlen=window)

        @functools.wraps(fn)
        def evented_call(*args, **kwargs):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            pairs.append((start, end))
            return out

        def report() -> dict:
            torch.cuda.synchronize()  # ok: FC101
            ms = [s.elapsed_time(e) for s, e in pairs]
            return {"name": name, "calls": len(ms), "mean_ms": sum(ms) / len(ms) if ms else 0.0}

        evented_call.report = report
        return evented_call

    return deco


def retry_on_oom(times: int = 1):
    assert times >= 1, "retry_on_oom needs at least one retry"  # expect: FC109

    def deco(fn):
        @functools.wraps(fn)
        def attempt(*args, **kwargs):
            for i in range(times + 1):
                try:
                    return fn(*args, **kwargs)
                except torch.cuda.OutOfMemoryError:
                    if i == times:
                        raise
                    torch.cuda.empty_cache()

        return attempt

    return deco


def inference_step(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return run


def make_step_stats() -> tuple[Callable, Callable[[], dict]]:
    """Returns ``(record, report)`` sharing three counters."""
    steps = 0
    kv_tokens = 0
    peak_len = 0

    def record(batch) -> None:
        nonlocal steps, kv_tokens, peak_len
        steps += 1
        kv_tokens += int(batch.seq_lens_cpu.sum())  # ok: FC101
        peak_len = max(peak_len, batch.seq_lens.max().item())  # expect: FC101

    def report() -> dict:
        return {"steps": steps, "kv_tokens": kv_tokens, "peak_len": peak_len}

    return record, report
