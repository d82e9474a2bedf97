"""Forward context and full CUDA graphs keyed by batch descriptor."""
from __future__ import annotations

import bisect
import enum
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

import torch

CUDAGRAPH_DEBUG = os.getenv("VLLM_CUDAGRAPH_DEBUG", "0") == "1"


class CUDAGraphMode(enum.Enum):
    NONE = 0
    FULL = 2

    def has_full_cudagraphs(self) -> bool:
        return self is CUDAGraphMode.FULL


class BatchDescriptor(NamedTuple):
    num_tokens: int
    uniform_decode: bool = False


class ForwardContext(NamedTuple):
    attn_metadata: dict[str, Any]
    batch_descriptor: Optional[BatchDescriptor]
    mode: CUDAGraphMode


_forward_context: Optional[ForwardContext] = None


def get_forward_context() -> ForwardContext:
    if _forward_context is None:
        raise RuntimeError("attention ran outside set_forward_context()")
    return _forward_context


@contextmanager
def set_forward_context(attn_metadata, batch_descriptor=None, mode=CUDAGraphMode.NONE):
    global _forward_context
    prev, _forward_context = _forward_context, ForwardContext(attn_metadata, batch_descriptor, mode)
    try:
        yield _forward_context
    finally:
        _forward_context = prev


class CudagraphDispatcher:
    def __init__(self, capture_sizes: list[int], mode: CUDAGraphMode) -> None:
        self.capture_sizes, self.mode = sorted(capture_sizes), mode

    def dispatch(self, num_tokens: int, uniform_decode: bool) -> tuple[CUDAGraphMode, Optional[BatchDescriptor]]:
        i = bisect.bisect_left(self.capture_sizes, num_tokens)
        # full graphs only for uniform-decode batches; mixed batches run eagerly
        if self.mode is CUDAGraphMode.NONE or not uniform_decode or i == len(self.capture_sizes):
            return CUDAGraphMode.NONE, None
        return CUDAGraphMode.FULL, BatchDescriptor(self.capture_sizes[i], True)


@dataclass
class CUDAGraphEntry:
    graph: Optional[torch.cuda.CUDAGraph] = None
    output: Any = None
    input_addresses: list[int] = field(default_factory=list)


class CUDAGraphWrapper:
    def __init__(self, runnable: Callable[..., Any], mode: CUDAGraphMode) -> None:
        self.runnable, self.mode = runnable, mode
        self.entries: dict[BatchDescriptor, CUDAGraphEntry] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, *args, **kwargs):
        ctx = get_forward_context()
        if ctx.batch_descriptor is None or ctx.mode is not self.mode:
            return self.runnable(*args, **kwargs)
        entry = self.entries.setdefault(ctx.batch_descriptor, CUDAGraphEntry())
        if entry.graph is None:
            return self._capture_entry(entry, args, kwargs)
        if CUDAGRAPH_DEBUG and [a.data_ptr() for a in args if isinstance(a, torch.Tensor)] != entry.input_addresses:
            raise RuntimeError(f"graph {ctx.batch_descriptor} replayed with moved inputs, first input {args[0]}")  # ok: FC101
        entry.graph.replay()
        return entry.output

    def _capture_entry(self, entry: CUDAGraphEntry, args, kwargs):
        assert entry.graph is None, "graph entry captured twice"  # ok: FC109
        torch.cuda.synchronize()  # ok: FC101
        entry.input_addresses = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = self.runnable(*args, **kwargs)
        entry.graph, entry.output = graph, output
        return output
