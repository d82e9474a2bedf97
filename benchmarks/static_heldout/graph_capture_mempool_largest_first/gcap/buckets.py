"""Bucket arithmetic: which captured size a batch pads to, and the host indptr of a padded batch."""

from __future__ import annotations

import bisect
from typing import Iterable, List, Sequence

import numpy as np


def largest_first(buckets: Iterable[int]) -> List[int]:
    """Capture order: the largest bucket claims the shared pool's blocks, smaller ones reuse them."""
    return sorted(set(buckets), reverse=True)


def pad_to_bucket(bs: int, buckets: Sequence[int]) -> int:
    assert bs <= buckets[-1], f"batch of {bs} is larger than the largest captured bucket"  # expect: FC109
    return buckets[bisect.bisect_left(buckets, bs)]


def padded_indptr(pages: np.ndarray, padded: int) -> np.ndarray:
    """Page indptr over ``padded`` rows: live rows first, then one null page per padding row."""
    bs = pages.shape[0]
    out = np.zeros(padded + 1, dtype=np.int32)
    np.cumsum(pages, out=out[1 : bs + 1])
    out[bs + 1 :] = out[bs] + np.arange(1, padded - bs + 1, dtype=np.int32)
    return out


def padded_last_page_len(lens: np.ndarray, padded: int, page_size: int) -> np.ndarray:
    bs = lens.shape[0]
    out = np.ones(padded, dtype=np.int32)
    out[:bs] = (lens - 1) % page_size + 1
    return out
