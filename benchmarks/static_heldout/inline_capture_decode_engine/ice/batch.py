"""Host-side batch types and page-table helpers shared by the backends and the model."""
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch


@dataclass
class DecodeBatch:
    input_ids: torch.Tensor        # [bs] int64, device
    positions: torch.Tensor        # [bs] int64, device
    seq_lens: torch.Tensor         # [bs] int32, device (after this step's token)
    seq_lens_cpu: torch.Tensor     # [bs] int32, host mirror
    page_table: torch.Tensor       # [bs, pages_per_request] int32, device
    page_table_np: np.ndarray      # host mirror of page_table
    request_ids: List[int] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens_cpu.shape[0])

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max())  # expect: FC101


def host_indptr(seq_lens_cpu: torch.Tensor, page_size: int) -> torch.Tensor:
    pages = (seq_lens_cpu + page_size - 1) // page_size
    indptr = torch.zeros(pages.numel() + 1, dtype=torch.int32)
    torch.cumsum(pages, 0, out=indptr[1:])
    return indptr


def host_last_page_len(seq_lens_cpu: torch.Tensor, page_size: int) -> torch.Tensor:
    return ((seq_lens_cpu - 1) % page_size + 1).to(torch.int32)


def flat_page_indices(page_table_np: np.ndarray, seq_lens_np: np.ndarray, page_size: int) -> np.ndarray:
    pages = (seq_lens_np + page_size - 1) // page_size
    rows = [page_table_np[i, : pages[i]] for i in range(len(pages))]
    if not rows:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate(rows).astype(np.int32)


def num_pages_total(seq_lens: torch.Tensor, page_size: int) -> int:
    return int(((seq_lens + page_size - 1) // page_size).sum())  # expect: FC101
