"""Host-side page bookkeeping and indptr helpers shared by every family."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import torch


@dataclass
class RowState:
    rid: int
    family: str
    tokens: List[int]
    pages: List[int] = field(default_factory=list)


def window_kv_indptr(seq_lens: torch.Tensor, window: int, page_size: int) -> torch.Tensor:
    """Indptr over the pages a sliding-window row reads: those overlapping its last `window` tokens."""
    first = torch.clamp(seq_lens - window, min=0) // page_size
    last = (seq_lens + page_size - 1) // page_size
    counts = (last - first).to(torch.int32)
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0, dtype=torch.int32)])


def pad_indptr(indptr: torch.Tensor, bs: int) -> torch.Tensor:
    return torch.cat([indptr, indptr[-1:].expand(bs + 1 - indptr.numel())])


def pad_last_page_len(last_page_len: torch.Tensor, bs: int) -> torch.Tensor:
    return torch.cat([last_page_len, last_page_len.new_ones(bs - last_page_len.numel())])
