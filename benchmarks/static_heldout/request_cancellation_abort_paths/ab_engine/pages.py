from __future__ import annotations

from typing import List


class PagePool:
    """Host free list of KV pages; page 0 is the padding page."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free: List[int] = list(range(num_pages - 1, 0, -1))

    def alloc(self, n: int) -> List[int]:
        if n > len(self._free):
            raise MemoryError(f"need {n} KV pages, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: List[int]) -> None:
        self._free.extend(pages)

    @property
    def num_free(self) -> int:
        return len(self._free)
