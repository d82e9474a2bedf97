"""``StepScope``: a ContextDecorator that tags a step for nsys and times it with CUDA events."""
from __future__ import annotations

import contextlib
from typing import List, Tuple

import torch

from scopes.config import STEP_KINDS


class StepScope(contextlib.ContextDecorator):
    """Used as ``@StepScope("decode")`` on step methods, or as ``with StepScope("eager"):`` around a region."""
    def __init__(self, kind: str) -> None:
        assert kind in STEP_KINDS, f"unknown step kind {kind!r}"  # expect: FC109
        self.kind = kind
        self._start = self._end = None
        self.pending: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def __enter__(self) -> "StepScope":
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        torch.cuda.nvtx.range_push(f"step:{self.kind}")
        self._start.record()
        return self

    def __exit__(self, *exc) -> bool:
        assert self._start is not None and self._end is not None, "__exit__ without __enter__"  # ok: FC109
        self._end.record()
        torch.cuda.nvtx.range_pop()
        self.pending.append((self._start, self._end))
        return False
