"""Host-side KV page allocator (a numpy occupancy map and a free list)."""

from __future__ import annotations

import numpy as np


class PagePool:
    def __init__(self, num_pages: int, page_size: int):
        self.num_pages = num_pages
        self.page_size = page_size
        self.used = np.zeros(num_pages, dtype=bool)
        # popped from the end: low page ids are handed out first
        self.free: list[int] = list(range(num_pages - 1, -1, -1))

    def available(self) -> int:
        return len(self.free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self.free):
            raise MemoryError(f"need {n} KV pages, {len(self.free)} free")
        pages = [self.free.pop() for _ in range(n)]
        self.used[pages] = True
        return pages

    def release(self, pages: list[int]) -> None:
        if not pages:
            return
        self.used[pages] = False
        self.free.extend(sorted(pages, reverse=True))

    def fragmentation(self) -> float:
        """Share of free pages below the highest page in use."""
        in_use = np.flatnonzero(self.used)
        if in_use.size == 0:
            return 0.0
        return 1.0 - in_use.size / (int(in_use[-1]) + 1)

    def compact(self, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Move up to ``limit`` of the highest used pages into the lowest free ones.

        Returns ``(src, dst)`` page ids; the caller moves the KV contents.
        """
        src = np.flatnonzero(self.used)[::-1][:limit]
        dst = np.flatnonzero(~self.used)[:limit]
        n = min(src.size, dst.size)
        src, dst = src[:n], dst[:n]
        downward = dst < src
        src, dst = src[downward], dst[downward]  # ok: FC101
        self.used[src] = False
        self.used[dst] = True
        self.free = np.flatnonzero(~self.used)[::-1].tolist()
        return src.astype(np.int32), dst.astype(np.int32)
