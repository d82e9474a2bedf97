from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import Any, List, Optional

import torch


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    IDLE = auto()

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND


@dataclass
class Req:
    rid: str
    origin_input_ids: List[int]
    fill_ids: List[int] = field(default_factory=list)
    output_ids: List[int] = field(default_factory=list)
    req_pool_idx: int = -1
    start_send_idx: int = 0
    is_chunked: int = 0
    disagg_kv_sender: Any = None


@dataclass
class ScheduleBatch:
    reqs: List[Req]
    forward_mode: ForwardMode
    input_ids: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_pool_indices: torch.Tensor
    return_logprob: bool = False
    logprob_cpu: Optional[torch.Tensor] = None
    bid: int = 0

    def batch_size(self) -> int:
        return len(self.reqs)

    def copy(self) -> "ScheduleBatch":
        return ScheduleBatch(self.reqs, self.forward_mode, self.input_ids, self.seq_lens, self.seq_lens_cpu, self.req_pool_indices, self.return_logprob, None, self.bid)


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, device: str):
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
