"""Index arithmetic the CPU does for the planner: CSR page lists, buckets, page counts."""
from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np
import torch

__all__ = [
    "bucket_for",
    "cdiv",
    "fill_kv_indices",
    "kv_indptr_from_lens",
    "num_pages_in_batch",
    "window_kv_indices",
]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def bucket_for(bs: int, buckets: Sequence[int]) -> int:
    """Smallest captured batch size that holds ``bs`` rows."""
    i = bisect.bisect_left(buckets, bs)
    if i == len(buckets):
        raise ValueError(f"batch size {bs} exceeds the largest captured bucket {buckets[-1]}")
    return buckets[i]


def kv_indptr_from_lens(seq_lens_np: np.ndarray, page_size: int, indptr_np: np.ndarray) -> int:
    """Fill ``indptr_np[: bs + 1]`` with the page CSR offsets; returns the page count."""
    bs = seq_lens_np.shape[0]
    assert indptr_np.shape[0] > bs, "indptr mirror too small"  # expect: FC109
    pages = (seq_lens_np + page_size - 1) // page_size
    indptr_np[0] = 0
    np.cumsum(pages, dtype=np.int32, out=indptr_np[1 : bs + 1])
    return int(indptr_np[bs])  # ok: FC101


def fill_kv_indices(page_table_np: np.ndarray, seq_lens_np: np.ndarray, page_size: int, indices_np: np.ndarray) -> int:
    """Flatten each row's live pages into ``indices_np`` (CSR order); returns how many were written."""
    n = 0
    for row, seq_len in enumerate(seq_lens_np.tolist()):  # ok: FC101
        pages = cdiv(seq_len, page_size)
        indices_np[n : n + pages] = page_table_np[row, :pages]
        n += pages
    return n


def window_kv_indices(
    page_table_np: np.ndarray,
    seq_lens_np: np.ndarray,
    page_size: int,
    window_pages: int,
    indptr_np: np.ndarray,
    indices_np: np.ndarray,
) -> int:
    """Like ``fill_kv_indices`` but keeps only the last ``window_pages`` pages of each row."""
    n = 0
    indptr_np[0] = 0
    for row in range(seq_lens_np.shape[0]):
        pages = cdiv(int(seq_lens_np[row]), page_size)  # ok: FC101
        first = max(0, pages - window_pages)
        indices_np[n : n + pages - first] = page_table_np[row, first:pages]
        n += pages - first
        indptr_np[row + 1] = n
    return n


def num_pages_in_batch(seq_lens: torch.Tensor, page_size: int) -> int:
    """Pages the batch's KV spans: sizes the flat kv_indices view of an extend step."""
    pages = torch.div(seq_lens + page_size - 1, page_size, rounding_mode="floor")
    return int(pages.sum())  # expect: FC101
