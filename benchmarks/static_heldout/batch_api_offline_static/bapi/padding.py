"""Padding of static batches and page arithmetic, shared by the runner, the builder and the attention."""
from __future__ import annotations

import bisect
from typing import Optional, Sequence, Tuple

import numpy as np
import torch


def bucket_for(n: int, lengths: Sequence[int]) -> Optional[int]:
    i = bisect.bisect_left(lengths, n)
    return lengths[i] if i < len(lengths) else None


def _check_lengths(lengths: Sequence[int], limit: int) -> None:
    assert max(lengths) <= limit  # expect: FC109


def pad_batch(prompts: Sequence[Sequence[int]], padded_len: int, pad_id: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Right-pad every prompt to ``padded_len``; returns (ids[rows, padded_len], lens[rows])."""
    lens = np.fromiter((len(p) for p in prompts), dtype=np.int32, count=len(prompts))
    _check_lengths(lens.tolist(), padded_len)
    ids = np.full((len(prompts), padded_len), pad_id, dtype=np.int64)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
    return ids, lens


def last_page_lens(seq_lens: torch.Tensor, page_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(pages per row, tokens on the last page) for a vector of sequence lengths."""
    pages = (seq_lens + page_size - 1) // page_size
    return pages, seq_lens - (pages - 1) * page_size
