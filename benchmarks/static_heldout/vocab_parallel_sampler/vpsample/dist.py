"""A thin tensor-parallel group over torch.distributed."""
from __future__ import annotations

import torch
import torch.distributed as dist


class TPGroup:
    def __init__(self, rank: int, world_size: int, backend: str = "nccl"):
        self.rank = rank
        self.world_size = world_size
        self._backend = backend
        self.group = dist.new_group(list(range(world_size)), backend=backend) if dist.is_initialized() else None

    def all_gather_into(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        if self._backend == "nccl":  # ok: FC103
            dist.all_gather_into_tensor(out, inp, group=self.group)
        else:
            dist.all_gather(list(out.chunk(self.world_size)), inp, group=self.group)

    def all_reduce_sum(self, t: torch.Tensor) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
