"""Tensor/expert parallel group with a graph-capture context for the custom all-reduce."""
from __future__ import annotations

import contextlib
from typing import ContextManager, Optional

import torch
import torch.distributed as dist


class TPGroup:
    def __init__(self, world_size: int, rank: int, group: Optional["dist.ProcessGroup"] = None):
        self.world_size, self.rank, self.group = world_size, rank, group
        self.custom_ar = None  # set when NVLink custom all-reduce is available

    @classmethod
    def from_env(cls) -> "TPGroup":
        return cls(dist.get_world_size(), dist.get_rank(), dist.group.WORLD) if dist.is_initialized() else cls(1, 0)

    def graph_capture_context(self) -> ContextManager:
        if self.world_size == 1 or self.custom_ar is None:
            return contextlib.nullcontext()
        return self.custom_ar.capture()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        if self.custom_ar is not None:
            return self.custom_ar.all_reduce(x)
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((self.world_size * x.shape[0],) + tuple(x.shape[1:]))
        dist.all_gather_into_tensor(out, x, group=self.group)
        return out

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((x.shape[0] // self.world_size,) + tuple(x.shape[1:]))
        dist.reduce_scatter_tensor(out, x, group=self.group)
        return out

