"""Point-to-point ring of KV blocks between context-parallel ranks."""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist


class RingComm:
    def __init__(self, group: dist.ProcessGroup, device: torch.device):
        self.group = group
        self.device = device
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.send_rank = dist.get_global_rank(group, (self.rank + 1) % self.world)
        self.recv_rank = dist.get_global_rank(group, (self.rank - 1) % self.world)
        self.comm_stream = torch.cuda.Stream(device)
        self._ops: List[dist.P2POp] = []
        self._reqs: list = []

    def send_recv(self, block: torch.Tensor, recv_buf: Optional[torch.Tensor] = None) -> torch.Tensor:
        recv = torch.empty_like(block) if recv_buf is None else recv_buf
        self._ops.append(dist.P2POp(dist.isend, block, self.send_rank, group=self.group))
        self._ops.append(dist.P2POp(dist.irecv, recv, self.recv_rank, group=self.group))
        return recv

    def commit(self) -> None:
        with torch.cuda.stream(self.comm_stream):
            self._reqs = dist.batch_isend_irecv(self._ops)
        self._ops = []

    def wait(self) -> None:
        assert not self._ops, "commit() the queued ops before waiting"  # ok: FC109
        for req in self._reqs:
            req.wait()
        torch.cuda.current_stream().wait_stream(self.comm_stream)
        self._reqs = []

    def all_gather_states(self, v: torch.Tensor, s: torch.Tensor, v_out: torch.Tensor, s_out: torch.Tensor) -> None:
        """Gather every rank's partial (output, lse); the outputs are ``world`` blocks along dim 0."""
        dist.all_gather_into_tensor(v_out, v.contiguous(), group=self.group)
        dist.all_gather_into_tensor(s_out, s.contiguous(), group=self.group)
