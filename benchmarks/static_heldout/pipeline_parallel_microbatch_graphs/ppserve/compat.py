"""Helpers around FlashInfer objects that the stage code shares."""
from __future__ import annotations

from typing import Iterable, List

import flashinfer


def flashinfer_version() -> str:
    return getattr(flashinfer, "__version__", "0.0.0")


def bucket_capacity(w) -> int:
    """The batch size a graph-mode decode wrapper was built for."""
    return w._fixed_batch_size  # expect: FC103


def usable_buckets(buckets: Iterable[int], max_bs: int) -> List[int]:
    out = sorted({b for b in buckets if 0 < b <= max_bs})
    if not out:
        raise ValueError(f"no graph bucket fits a microbatch of {max_bs} sequences (buckets={list(buckets)})")
    return out
