"""Timing and logging wrappers for the model runner and the attention backend."""
from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from typing import Callable, Dict, List

import torch

logger = logging.getLogger(__name__)
TIMINGS: Dict[str, List[float]] = defaultdict(list)


def step_timer(label: str):
    """Times the wrapped call on the GPU with a pair of CUDA events."""
    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            end.synchronize()  # expect: FC101
            TIMINGS[label].append(start.elapsed_time(end))
            logger.debug("%s: %.3f ms, out=%s", label, TIMINGS[label][-1], out)  # ok: FC101
            return out
        return wrapper
    return deco


def instrument(*names: str):
    """Class decorator: wraps the named methods with wall-clock timing and a result log line."""
    assert names, "instrument() needs at least one method name"  # expect: FC109

    def deco(cls):
        for name in names:
            setattr(cls, name, _logged(getattr(cls, name), f"{cls.__name__}.{name}"))
        return cls
    return deco


def _logged(fn: Callable, label: str) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        TIMINGS[label].append((time.perf_counter() - t0) * 1e3)
        if isinstance(out, torch.Tensor):
            logger.debug(f"{label}: {tuple(out.shape)} {out.dtype} norm={out.norm()}")  # expect: FC101
        return out
    return wrapper
