"""Host helpers for sliding-window page spans."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch


def window_page_counts(seq_lens_np: np.ndarray, window: int, page_size: int) -> Tuple[np.ndarray, np.ndarray]:
    last = (seq_lens_np + page_size - 1) // page_size
    first = np.zeros_like(last)
    sliding = seq_lens_np > window
    first[sliding] = (seq_lens_np[sliding] - window) // page_size  # ok: FC101
    return (last - first).astype(np.int32), first.astype(np.int32)


def build_indptr_np(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def last_page_len_np(seq_lens_np: np.ndarray, page_size: int) -> np.ndarray:
    return ((seq_lens_np - 1) % page_size + 1).astype(np.int32)


def gather_window_pages_np(page_ids_np: np.ndarray, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    rows = [page_ids_np[i, first[i] : first[i] + counts[i]] for i in range(len(counts))]
    return np.concatenate(rows).astype(np.int32) if rows else np.zeros(0, dtype=np.int32)


def last_slot_np(page_ids_np: np.ndarray, counts_np: np.ndarray, seq_lens_np: np.ndarray, page_size: int):
    last_page = page_ids_np[np.arange(len(counts_np)), counts_np - 1].astype(np.int64)
    return last_page * page_size + (seq_lens_np - 1) % page_size


def pages_to_release(first_page: torch.Tensor, released: torch.Tensor) -> List[int]:
    """Local pages per row that slid out of the window since the last release."""
    return (first_page - released).clamp_min(0).tolist()  # expect: FC101
