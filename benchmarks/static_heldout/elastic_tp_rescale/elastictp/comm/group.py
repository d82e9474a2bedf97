"""Process groups for every TP degree the engine can run at."""
from __future__ import annotations

from typing import Dict, Sequence

import torch
import torch.distributed as dist


class TPGroupRegistry:
    def __init__(self, degrees: Sequence[int], backend: str = "nccl") -> None:
        self.world = dist.get_world_size()
        self.rank = dist.get_rank()
        self._groups: Dict[int, object] = {
            tp: dist.new_group(ranks=list(range(tp)), backend=backend) for tp in degrees
        }
        self.cpu_group = dist.new_group(backend="gloo")

    def group(self, tp: int):
        return self._groups[tp]

    def active(self, tp: int) -> bool:
        return self.rank < tp

    def all_reduce(self, t: torch.Tensor, tp: int) -> torch.Tensor:
        dist.all_reduce(t, group=self._groups[tp])
        return t

    def gather_vocab(self, logits: torch.Tensor, tp: int) -> torch.Tensor:
        parts = [torch.empty_like(logits) for _ in range(tp)]
        dist.all_gather(parts, logits.contiguous(), group=self._groups[tp])
        return torch.cat(parts, dim=-1)
