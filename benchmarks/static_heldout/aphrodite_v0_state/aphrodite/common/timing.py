"""Decorators around the worker's phases: NVTX ranges, per-step latency, one-off phase timing."""

from __future__ import annotations

import functools
import logging
import time
from typing import Callable, Dict, List

import torch

logger = logging.getLogger(__name__)

STEP_TIMES: Dict[str, List[float]] = {}


def nvtx_range(name: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            torch.cuda.nvtx.range_push(name)
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.nvtx.range_pop()

        return wrapper

    return deco


def step_timer(name: str) -> Callable:
    """Record the latency of every call of the wrapped step in ``STEP_TIMES[name]``."""

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()  # expect: FC101
            STEP_TIMES.setdefault(name, []).append(time.perf_counter() - start)
            return out

        return wrapper

    return deco


def phase_timer(name: str) -> Callable:
    """Log the wall time of a one-off phase (weight loading, graph capture)."""

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()  # ok: FC101
            logger.info("%s took %.2f s", name, time.perf_counter() - start)
            return out

        return wrapper

    return deco
