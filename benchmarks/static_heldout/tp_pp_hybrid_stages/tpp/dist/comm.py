"""Tensor-parallel all-reduce and pipeline send/recv for one stage.

The header tensor travels on the device (NCCL), ahead of the activations.
"""

import logging
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist
from torch.cuda import synchronize as cuda_sync

if TYPE_CHECKING:
    from tpp_stage.attention import StageAttention

logger = logging.getLogger(__name__)

HEADER_LEN = 4


class StageComm:
    def __init__(self, tp_group, pp_group, stage: int, num_stages: int, hidden_size: int,
                 attn: "StageAttention", device, deterministic: bool = False):
        self.tp_group = tp_group
        self.pp_group = pp_group
        self.stage = stage
        self.num_stages = num_stages
        self.hidden_size = hidden_size
        self.attn = attn
        self.device = device
        self.deterministic = deterministic
        self._backend = "nccl"
        self.header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=device)
        self.meta_recv = torch.zeros(attn.max_bs + 1, dtype=torch.int32, device=device)
        self.comm_stream = torch.cuda.Stream(device=device)

    @property
    def prev_rank(self) -> int:
        return dist.get_global_rank(self.pp_group, self.stage - 1)

    @property
    def next_rank(self) -> int:
        return dist.get_global_rank(self.pp_group, self.stage + 1)

    def all_reduce_(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, group=self.tp_group)
        if self.deterministic:
            cuda_sync()  # expect: FC101
        return t

    def send_activations(self, hidden: torch.Tensor, mb_index: int, bs: int) -> None:
        if self.stage == self.num_stages - 1:
            return
        self.header[0] = hidden.shape[0]
        self.header[1] = mb_index
        self.header[2] = bs
        with torch.cuda.stream(self.comm_stream):
            dist.send(self.header, self.next_rank, group=self.pp_group)
            dist.send(hidden.contiguous(), self.next_rank, group=self.pp_group)

    def recv_activations(self, mb_index: int) -> Optional[torch.Tensor]:
        if self.stage == 0:
            return None
        dist.recv(self.header, self.prev_rank, group=self.pp_group)
        num_tokens, _, bs = self.header[:3].tolist()  # expect: FC101
        if getattr(self, "_recv_buf", None) is None:
            self._recv_buf = torch.empty(self.attn.max_tokens, self.hidden_size, dtype=torch.bfloat16, device=self.device)  # ok: FC107
        buf = self._recv_buf[:num_tokens]
        dist.recv(buf, self.prev_rank, group=self.pp_group)
        # the indptr rides along so later stages need not rebuild it
        dist.recv(self.meta_recv[: bs + 1], self.prev_rank, group=self.pp_group)
        self.attn.kv_indptr[mb_index, : bs + 1].copy_(self.meta_recv[: bs + 1])  # expect: FC104
        return buf

    def describe(self) -> str:
        return f"stage {self.stage}/{self.num_stages} over {self._backend}"  # ok: FC103
