"""Forwarding middleware around step functions.

Every layer is a callable object whose ``__call__(self, *args, **kwargs)`` does a little work and forwards
to the next layer.  The model runner, the sampler and the speculative drafter each build a stack:

    StepTimerLayer(LoggingLayer(KwargsNormalizeLayer(CallableLayer(fn))))
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Optional

import torch

logger = logging.getLogger(__name__)


class Middleware:
    """Base layer: forwards everything to ``inner`` unchanged."""

    def __init__(self, inner: Callable[..., Any]):
        self.inner = inner

    def __call__(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def describe(self) -> str:
        inner = self.inner
        name = type(self).__name__
        if isinstance(inner, Middleware):
            return f"{name} -> {inner.describe()}"
        return f"{name} -> {getattr(inner, '__qualname__', repr(inner))}"


class CallableLayer(Middleware):
    """Innermost layer: calls the wrapped function."""

    def __init__(self, fn: Callable[..., Any], name: str = ""):
        super().__init__(fn)
        self.fn = fn
        self._backend = name or getattr(fn, "__qualname__", "fn")

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    @property
    def label(self) -> str:
        return self._backend  # ok: FC103


class KwargsNormalizeLayer(Middleware):
    """Fills keyword defaults (``phase``, ``capturing``) and drops keys the inner function never takes."""

    def __init__(self, inner, defaults: Optional[Dict[str, Any]] = None, drop: tuple = ()):
        super().__init__(inner)
        self.defaults = dict(defaults or {})
        self.drop = tuple(drop)

    def __call__(self, *args, **kwargs):
        assert args or "forward_batch" in kwargs, "a step needs its batch"  # expect: FC109
        assert self.inner is not None  # ok: FC109
        for key, value in self.defaults.items():
            kwargs.setdefault(key, value)
        for key in self.drop:
            kwargs.pop(key, None)
        return self.inner(*args, **kwargs)


class LoggingLayer(Middleware):
    """Logs a line every ``every`` steps."""

    def __init__(self, inner, every: int = 50, tag: str = "step"):
        super().__init__(inner)
        self.every = max(1, every)
        self.tag = tag
        self.count = 0

    def __call__(self, *args, **kwargs):
        self.count += 1
        fb = args[0] if args else kwargs.get("forward_batch")
        if fb is not None and self.count % self.every == 0:
            logger.debug("%s seq_lens=%s", self.tag, fb.seq_lens)  # ok: FC101
            logger.info(f"{self.tag} #{self.count}: bs={fb.batch_size} seq_lens={fb.seq_lens}")  # expect: FC101
            longest = fb.seq_lens_cpu.max().item()
            if longest > 32768:
                logger.warning("%s: long context step (%d tokens)", self.tag, longest)
        return self.inner(*args, **kwargs)


class StepTimerLayer(Middleware):
    """Measures the GPU time of every step with a pair of CUDA events."""

    def __init__(self, inner, name: str = "step"):
        super().__init__(inner)
        self.name = name
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.samples: list = []

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        self.start.record()
        out = self.inner(*args, **kwargs)
        self.end.record()
        self.end.synchronize()  # expect: FC101
        self.samples.append((self.start.elapsed_time(self.end), time.perf_counter() - t0))
        if len(self.samples) > 1024:
            self.samples = self.samples[-512:]
        return out


class HostTimerLayer(Middleware):
    """Wall-clock only: used around the capture, where the events above cannot be read."""

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.inner(*args, **kwargs)
        logger.debug("%s took %.3f ms", getattr(self.inner, "name", "stage"), (time.perf_counter() - t0) * 1e3)
        return out


def build_step_stack(fn: Callable[..., Any], every: int = 50, tag: str = "decode") -> Middleware:
    stack: Middleware = CallableLayer(fn, name=tag)
    stack = KwargsNormalizeLayer(stack, defaults={"capturing": False}, drop=("trace_id",))
    stack = LoggingLayer(stack, every=every, tag=tag)
    stack = StepTimerLayer(stack, name=tag)
    return stack


def build_capture_stack(fn: Callable[..., Any], tag: str = "capture") -> Middleware:
    stack: Middleware = CallableLayer(fn, name=tag)
    stack = KwargsNormalizeLayer(stack, defaults={"capturing": True}, drop=("trace_id",))
    return HostTimerLayer(stack)
