import numpy as np
import torch


def apply_page_table(
    dst: torch.Tensor,
    staging: torch.Tensor,
    staging_np: np.ndarray,
    page_table_np: np.ndarray,
    seq_lens_np: np.ndarray,
    page_size: int,
) -> int:
    """Flattens a frontend page table into ``dst`` through a pinned staging tensor; returns the page count."""
    pages = (seq_lens_np + page_size - 1) // page_size
    nnz = int(pages.sum())
    pos = 0
    for i, p in enumerate(pages):
        staging_np[pos : pos + p] = page_table_np[i, :p]
        pos += p
    dst[:nnz].copy_(staging[:nnz], non_blocking=True)
    return nnz
