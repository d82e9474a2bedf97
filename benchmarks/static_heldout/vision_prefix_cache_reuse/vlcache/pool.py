"""Host-side page pool shared by cached image prefixes and request text pages."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np


class PagePool:
    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free: List[int] = list(range(num_pages - 1, 0, -1))  # page 0 is the null page
        self._used = 0
        self.refcount = np.zeros(num_pages, dtype=np.int32)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> Optional[List[int]]:
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        self.refcount[pages] = 1
        self._used += n
        return pages

    def incref(self, pages: List[int]) -> None:
        self.refcount[pages] += 1

    def decref(self, pages: List[int]) -> List[int]:
        self.refcount[pages] -= 1
        freed = [p for p in pages if self.refcount[p] == 0]
        self._free.extend(reversed(freed))
        self._used -= len(freed)
        return freed

    def compact(self) -> np.ndarray:
        """Renumber live pages densely from 1; returns old -> new page ids (identity for free pages)."""
        live = np.flatnonzero(self.refcount[1:] > 0) + 1
        mapping = np.arange(self.num_pages, dtype=np.int32)
        mapping[live] = np.arange(1, len(live) + 1, dtype=np.int32)
        self.refcount[1: len(live) + 1] = self.refcount[live].copy()
        self.refcount[len(live) + 1:] = 0
        self._free = list(range(self.num_pages - 1, len(live), -1))
        return mapping

    def stats(self) -> Dict[str, int]:
        assert self._used + len(self._free) == self.num_pages - 1  # ok: FC109
        return {"used": self._used, "free": len(self._free)}
