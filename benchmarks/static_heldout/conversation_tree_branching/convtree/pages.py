"""The KV page pool: refcounts on the host (the allocator's truth) and on the device (for the
copy-on-write check of the metadata builder)."""
from typing import List

import numpy as np
import torch


class PagePool:
    def __init__(self, num_pages: int, device: torch.device):
        self.free: List[int] = list(range(num_pages))
        self.refcount_np = np.zeros(num_pages, dtype=np.int32)
        self.refcount_gpu = torch.zeros(num_pages, dtype=torch.int32, device=device)

    def alloc(self, n: int) -> List[int]:
        if n > len(self.free):
            raise MemoryError(f"page pool exhausted: need {n}, have {len(self.free)}")
        pages, self.free = self.free[:n], self.free[n:]
        self.refcount_np[pages] = 1
        return pages

    def share(self, pages: List[int]) -> None:
        self.refcount_np[pages] += 1

    def release(self, pages: List[int]) -> None:
        self.refcount_np[pages] -= 1
        self.free.extend(p for p in pages if self.refcount_np[p] == 0)
        self._check_refcounts()

    def _check_refcounts(self) -> None:
        assert (self.refcount_np >= 0).all(), "page released more often than shared"  # ok: FC109

    def push_refcounts(self) -> None:
        self.refcount_gpu.copy_(torch.from_numpy(self.refcount_np), non_blocking=True)
