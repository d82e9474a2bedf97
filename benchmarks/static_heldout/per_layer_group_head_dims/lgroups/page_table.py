"""Per-group page tables on the host and token-to-row maps on the device."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class GroupPageTable:
    indptr: np.ndarray
    indices: np.ndarray
    last_page_len: np.ndarray

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])


def build_group_page_table(
    seq_lens_np: np.ndarray, page_size: int, req_pages: List[np.ndarray], window: int = -1
) -> GroupPageTable:
    """Pages each request reads in one group; a windowed group skips pages left of its window."""
    assert page_size > 0 and page_size & (page_size - 1) == 0, "page size must be a power of two"  # expect: FC109
    n = len(seq_lens_np)
    num_pages = (seq_lens_np + page_size - 1) // page_size
    first = np.zeros(n, dtype=np.int64)
    if window > 0:
        first = np.maximum(seq_lens_np - window, 0) // page_size
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(num_pages - first, out=indptr[1:])
    if n:
        indices = np.concatenate([req_pages[i][first[i] : num_pages[i]] for i in range(n)]).astype(np.int32)
    else:
        indices = np.zeros(0, dtype=np.int32)
    last = ((seq_lens_np - 1) % page_size + 1).astype(np.int32)
    return GroupPageTable(indptr, indices, last)


def token_rows(q_lens: torch.Tensor, num_tokens: Optional[int] = None) -> torch.Tensor:
    """Batch row of every token of the step, on the device of ``q_lens``."""
    rows = torch.arange(q_lens.shape[0], device=q_lens.device)
    if num_tokens is None:
        return torch.repeat_interleave(rows, q_lens)  # expect: FC101
    return torch.repeat_interleave(rows, q_lens, output_size=num_tokens)  # ok: FC101


def group_slots(block_table: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, page_size: int) -> torch.Tensor:
    """Slot of every token in one group's pool (the groups' page sizes differ)."""
    return block_table[rows, positions // page_size].long() * page_size + positions % page_size
