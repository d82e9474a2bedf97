"""CUDA-event tracing around hot methods; the events are read back off the hot path by `StepTrace.drain`."""

from __future__ import annotations

import functools
from collections import deque
from typing import Callable, Deque, Dict, Tuple

import torch


class StepTrace:
    def __init__(self) -> None:
        self.pending: Deque[Tuple[str, torch.cuda.Event, torch.cuda.Event]] = deque()

    def push(self, label: str, start: torch.cuda.Event, end: torch.cuda.Event) -> None:
        self.pending.append((label, start, end))

    def drain(self) -> Dict[str, float]:
        out: Dict[str, float] = {}
        while self.pending:
            label, start, end = self.pending.popleft()
            end.synchronize()  # ok: FC101
            out[label] = out.get(label, 0.0) + start.elapsed_time(end)
        return out


TRACE = StepTrace()


def traced(label: str, *, sync: bool = False) -> Callable:
    assert label and "/" not in label, f"bad trace label {label!r}"  # expect: FC109

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                return fn(*args, **kwargs)
            finally:
                end.record()
                if sync:
                    torch.cuda.synchronize()  # expect: FC101
                TRACE.push(label, start, end)

        return wrapper

    return decorate


def traced_methods(*names: str):
    """Class decorator: wrap each named method in `traced`, labelled `Class.method`."""

    def decorate(cls):
        for name in names:
            setattr(cls, name, traced(f"{cls.__name__}.{name}")(getattr(cls, name)))
        return cls

    return decorate
