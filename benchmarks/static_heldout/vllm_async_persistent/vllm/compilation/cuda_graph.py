"""Full CUDA graphs keyed by batch descriptor, captured the first time a descriptor is seen."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Dict, NamedTuple, Optional

import torch


class CUDAGraphMode(enum.Enum):
    NONE, PIECEWISE, FULL = 0, 1, 2


class BatchDescriptor(NamedTuple):
    num_tokens: int
    uniform_decode: bool = False


@dataclass
class CUDAGraphEntry:
    desc: BatchDescriptor
    graph: Optional[torch.cuda.CUDAGraph] = None
    output: Optional[torch.Tensor] = None


class CUDAGraphWrapper:
    def __init__(self, runnable: Callable[..., torch.Tensor], mode: CUDAGraphMode):
        assert mode is not CUDAGraphMode.NONE, "only graph modes are wrapped"  # expect: FC109
        self.runnable, self.mode = runnable, mode
        self.pool = torch.cuda.graph_pool_handle()
        self.entries: Dict[BatchDescriptor, CUDAGraphEntry] = {}

    def __call__(self, *args, desc: Optional[BatchDescriptor] = None) -> torch.Tensor:
        if desc is None:
            return self.runnable(*args)
        entry = self.entries.get(desc)
        if entry is None:
            return self._capture(desc, *args)
        entry.graph.replay()
        # hand out a private copy so a caller cannot alias the graph's output
        entry.output = entry.output.clone()  # expect: FC107
        return entry.output

    def _capture(self, desc: BatchDescriptor, *args) -> torch.Tensor:
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = self.runnable(*args)
        self.entries[desc] = CUDAGraphEntry(desc, graph, output)
        return output
