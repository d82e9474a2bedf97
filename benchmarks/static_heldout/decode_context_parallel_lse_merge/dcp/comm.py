"""Collectives of the DCP group; every buffer is fixed so that graphs can capture them."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist

from dcp.config import DCPConfig


class DCPComm:
    def __init__(self, cfg: DCPConfig, rank: int, group: Optional[dist.ProcessGroup], device: torch.device):
        self.rank = rank
        self.world = cfg.dcp_size
        self.group = group
        self._backend = dist.get_backend(group) if dist.is_initialized() else "none"
        t = cfg.max_decode_tokens()
        h, d = cfg.num_local_heads, cfg.head_dim
        self.q_buf = torch.empty(self.world * t * h * d, dtype=torch.bfloat16, device=device)
        self.out_buf = torch.empty(self.world * t * self.world * h * d, dtype=torch.bfloat16, device=device)
        self.lse_buf = torch.empty(self.world * t * self.world * h, dtype=torch.float32, device=device)
        self._reserved = True

    def all_gather_heads(self, q: torch.Tensor) -> torch.Tensor:
        """[T, H, D] local heads -> [T, W*H, D] every head of the group."""
        t, h, d = q.shape
        dst = self.q_buf[: self.world * t * h * d].view(self.world, t, h, d)
        dist.all_gather_into_tensor(dst, q.contiguous(), group=self.group)
        return dst.permute(1, 0, 2, 3).reshape(t, self.world * h, d)

    def all_gather_states(self, o: torch.Tensor, lse: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        assert self._reserved, "DCPComm buffers are gone"  # ok: FC109
        t, hh, d = o.shape
        outs = self.out_buf[: self.world * t * hh * d].view(self.world, t, hh, d)
        lses = self.lse_buf[: self.world * t * hh].view(self.world, t, hh)
        dist.all_gather_into_tensor(outs, o.contiguous(), group=self.group)
        dist.all_gather_into_tensor(lses, lse.contiguous(), group=self.group)
        return outs, lses
