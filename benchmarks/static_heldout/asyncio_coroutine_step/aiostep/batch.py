"""What the scheduler streams to the executor: device tensors and the host mirrors they were built from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Request:
    rid: int
    slot: int
    seq_len: int
    last_token: int
    pages: list[int]


@dataclass
class ScheduledBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_ids: torch.Tensor
    seq_lens: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    qo_indptr: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    req_ids: tuple[int, ...] = ()
    is_decode: bool = True
    scratch: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens_cpu.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr_cpu[-1])  # ok: FC101


@torch.jit.script
def last_page_lens(seq_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    assert page_size > 0  # ok: FC109
    return (seq_lens - 1) % page_size + 1
