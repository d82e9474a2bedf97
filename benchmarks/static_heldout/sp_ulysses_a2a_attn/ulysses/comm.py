"""All-to-all between the sequence-sharded and the head-sharded layouts."""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist


class UlyssesComm:
    def __init__(self, group: dist.ProcessGroup, device: torch.device):
        self.group = group
        self.device = device
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._backend = dist.get_backend(group)  # ok: FC103
        self.staging: Optional[torch.Tensor] = None
        self._check_group()

    def _check_group(self) -> None:
        assert 0 <= self.rank < self.world and self._backend == "nccl"  # ok: FC109

    def seq_to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[T_local, H, D] on each rank -> [world * T_local, H / world, D]: all tokens, this rank's heads."""
        t, h, d = x.shape
        hp = h // self.world
        inp = x.reshape(t, self.world, hp, d).transpose(0, 1).contiguous()
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp, group=self.group)
        return out.reshape(self.world * t, hp, d)

    def heads_to_seq(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of seq_to_heads."""
        tt, hp, d = x.shape
        t = tt // self.world
        inp = x.reshape(self.world, t, hp, d).contiguous()
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp, group=self.group)
        return out.transpose(0, 1).reshape(t, self.world * hp, d)

    def gather_seq_lens(self, local_lens: torch.Tensor) -> List[int]:
        """Every rank's new-token count per request, for the all-to-all split sizes."""
        out = torch.empty(self.world * local_lens.numel(), dtype=local_lens.dtype, device=local_lens.device)
        dist.all_gather_into_tensor(out, local_lens, group=self.group)
        return out.tolist()  # expect: FC101

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.group)
        return x
