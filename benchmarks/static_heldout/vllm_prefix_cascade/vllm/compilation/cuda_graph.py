"""Full CUDA graphs keyed by batch descriptor, and the per-step forward context (a ContextVar)."""

from __future__ import annotations

import contextlib
import enum
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional

import torch


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


class BatchDescriptor(NamedTuple):
    num_tokens: int
    uniform_decode: bool = False


@dataclass
class ForwardContext:
    attn_metadata: Any
    batch_descriptor: Optional[BatchDescriptor]


_forward_context: ContextVar[Optional[ForwardContext]] = ContextVar("forward_context", default=None)


def get_forward_context() -> ForwardContext:
    ctx = _forward_context.get()
    if ctx is None:
        raise RuntimeError("no forward context: call inside set_forward_context()")
    return ctx


@contextlib.contextmanager
def set_forward_context(attn_metadata, batch_descriptor: Optional[BatchDescriptor] = None) -> Iterator[ForwardContext]:
    token = _forward_context.set(ForwardContext(attn_metadata, batch_descriptor))
    try:
        yield _forward_context.get()
    finally:
        _forward_context.reset(token)


@dataclass
class CUDAGraphEntry:
    batch_descriptor: BatchDescriptor
    cudagraph: Optional[torch.cuda.CUDAGraph] = None
    output: Optional[torch.Tensor] = None
    input_ids: Optional[torch.Tensor] = None
    positions: Optional[torch.Tensor] = None


class CUDAGraphWrapper:
    """Runs `runnable` eagerly, or replays the graph recorded for the step's batch descriptor."""

    def __init__(self, runnable: Callable[..., torch.Tensor], mode: CUDAGraphMode, graph_pool):
        self.runnable = runnable
        self.mode = mode
        self.graph_pool = graph_pool
        self.entries: Dict[BatchDescriptor, CUDAGraphEntry] = {}

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        desc = get_forward_context().batch_descriptor
        entry = self.entries.get(desc) if desc is not None else None
        if entry is None or entry.cudagraph is None:
            return self.runnable(input_ids, positions)
        entry.input_ids[: input_ids.shape[0]].copy_(input_ids)
        # positions arrive as a view of the runner's buffer: keep a private contiguous copy
        entry.positions = positions.clone()  # expect: FC107
        entry.cudagraph.replay()
        return entry.output

    def capture(self, desc: BatchDescriptor, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        entry = self.entries.setdefault(desc, CUDAGraphEntry(desc))
        entry.input_ids = input_ids.clone()  # ok: FC107
        entry.positions = positions.clone()
        self.runnable(entry.input_ids, entry.positions)  # warm-up outside the graph
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            entry.output = self.runnable(entry.input_ids, entry.positions)
        entry.cudagraph = graph
        return entry.output
