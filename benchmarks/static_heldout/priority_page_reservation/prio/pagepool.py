"""Host free list of KV pages; page 0 is the trash page that padded and reclaimed entries point at."""

from __future__ import annotations

import numpy as np

from prio.limits import PoolLimits


class PagePool:
    def __init__(self, limits: PoolLimits):
        self.num_pages = limits.num_pages
        self.trash_page = 0
        self._free = np.arange(1, limits.num_pages, dtype=np.int32)
        self._top = self._free.size

    @property
    def num_free(self) -> int:
        return self._top

    def alloc(self, n: int) -> np.ndarray:
        if n > self._top:
            raise MemoryError(f"need {n} pages, {self._top} free")
        self._top -= n
        return self._free[self._top : self._top + n].copy()

    def free(self, pages: np.ndarray) -> None:
        self._free[self._top : self._top + pages.size] = pages
        self._top += pages.size
