"""Small helpers shared by the prefill worker, the receiver and the decode pool."""
from __future__ import annotations

import contextlib
import time
from typing import Dict, Iterator, List, Tuple

import numpy as np
import torch


def exclusive_cumsum(lens: torch.Tensor) -> torch.Tensor:
    """[a, b, c] -> [0, a, a+b, a+b+c], on the device of ``lens``."""
    out = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=lens.device)
    out[1:] = torch.cumsum(lens, dim=0)
    return out


def pages_and_last_len(seq_lens: torch.Tensor, page_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    num_pages = (seq_lens + page_size - 1) // page_size
    last = seq_lens - (num_pages - 1) * page_size
    return num_pages, last


def total_from_indptr(indptr: torch.Tensor) -> int:
    """Number of entries an indptr describes."""
    return int(indptr[-1])  # expect: FC101


@torch.compile(dynamic=True)
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


@contextlib.contextmanager
def timed(stats: Dict[str, float], key: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stats[key] = stats.get(key, 0.0) + time.perf_counter() - t0


class PageAllocator:
    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = np.arange(num_pages - 1, -1, -1, dtype=np.int32)
        self.num_free = num_pages
        self.refcount_np = np.zeros(num_pages, dtype=np.int32)

    def alloc(self, n: int) -> List[int]:
        if n > self.num_free:
            raise RuntimeError(f"requested {n} pages, {self.num_free} free of {self.num_pages}")
        self.num_free -= n
        pages = self._free[self.num_free : self.num_free + n][::-1].copy()
        self.refcount_np[pages] += 1
        return pages.tolist()

    def free(self, pages: List[int]) -> None:
        arr = np.asarray(pages, dtype=np.int32)
        self.refcount_np[arr] -= 1
        released = arr[self.refcount_np[arr] == 0]
        self._free[self.num_free : self.num_free + released.size] = released
        self.num_free += int(released.size)
