"""Page-table arithmetic shared by the metadata builder and the engine."""
from __future__ import annotations

import numpy as np
import torch


def pages_for(lens: torch.Tensor, page_size: int) -> int:
    """Pages needed by the longest sequence of ``lens``."""
    return (int(lens.max()) + page_size - 1) // page_size  # expect: FC101


def last_page_lens(lens_np: np.ndarray, page_size: int) -> np.ndarray:
    return ((lens_np - 1) % page_size + 1).astype(np.int32)


def kv_indptr_from_lens(lens_np: np.ndarray, page_size: int) -> np.ndarray:
    pages = (lens_np + page_size - 1) // page_size
    indptr = np.zeros(len(lens_np) + 1, dtype=np.int32)
    np.cumsum(pages, out=indptr[1:])
    return indptr
