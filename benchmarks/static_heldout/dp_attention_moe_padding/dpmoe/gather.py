"""Token counts of every DP rank: the MoE dispatch pads every rank to the largest."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist


def gather_token_counts(local_count: int, group, device: torch.device) -> torch.Tensor:
    assert local_count >= 0, "negative token count"  # expect: FC109
    mine = torch.full((1,), local_count, dtype=torch.int32, device=device)
    out = torch.empty(dist.get_world_size(group), dtype=torch.int32, device=device)
    dist.all_gather_into_tensor(out, mine, group=group)
    return out


def gather_token_counts_cpu(local_count: int, cpu_group, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The same counts over the gloo group: the scheduler reads them without touching the GPU."""
    mine = torch.tensor([local_count], dtype=torch.int32)
    if out is None:
        out = torch.empty(dist.get_world_size(cpu_group), dtype=torch.int32)
    dist.all_gather_into_tensor(out, mine, group=cpu_group)
    return out


@dataclass
class MoEPadPlan:
    counts: torch.Tensor  # per-rank tokens on the device: the combine kernel's offsets
    counts_cpu: torch.Tensor
    dp_size: int

    def __post_init__(self) -> None:
        self._validate()

    @classmethod
    def uniform(cls, tokens: int, dp_size: int, device: torch.device) -> "MoEPadPlan":
        counts = torch.full((dp_size,), tokens, dtype=torch.int32, device=device)
        return cls(counts, torch.full((dp_size,), tokens, dtype=torch.int32), dp_size)

    @property
    def max_tokens(self) -> int:
        return int(self.counts.max())  # expect: FC101

    @property
    def max_tokens_cpu(self) -> int:
        return int(self.counts_cpu.max())  # ok: FC101

    def _validate(self) -> None:
        assert self.counts_cpu.numel() == self.dp_size  # ok: FC109
