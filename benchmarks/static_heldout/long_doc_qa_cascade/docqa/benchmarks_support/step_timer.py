"""Per-stage step timing, switched on for load tests with DOCQA_STEP_TIMING=1."""

import functools
import os
import time
from collections import defaultdict
from typing import Callable, Dict, List

import torch

_TIMING = os.environ.get("DOCQA_STEP_TIMING", "0") == "1"
_STATS: Dict[str, List[float]] = defaultdict(list)


def step_timer(name: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not _TIMING:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            torch.cuda.synchronize()  # expect: FC101
            _STATS[name].append(time.perf_counter() - start)
            return out

        return wrapper

    return deco


def summary() -> Dict[str, float]:
    return {k: sum(v) / max(1, len(v)) for k, v in _STATS.items()}
