"""Host-side page pools with per-request ownership and tail rollback."""
from __future__ import annotations

from typing import Dict, List


class PagePool:
    """A free list of pages; page 0 stays reserved as the null page."""

    def __init__(self, num_pages: int, page_size: int):
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: List[int] = list(range(num_pages - 1, 0, -1))
        self._owned: Dict[int, List[int]] = {}
        self._loose = 0  # pages handed out with alloc() and not owned by a request

    def alloc(self, n: int) -> List[int]:
        if n > len(self._free):
            raise MemoryError(f"pool exhausted: asked for {n} pages, {len(self._free)} free")
        self._loose += n
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: List[int]) -> None:
        self._loose -= len(pages)
        self._free.extend(reversed(pages))

    def pages_of(self, req_id: int) -> List[int]:
        return self._owned.setdefault(req_id, [])

    def adopt(self, req_id: int, pages: List[int]) -> None:
        self._loose -= len(pages)
        self.pages_of(req_id).extend(pages)

    def ensure(self, req_id: int, num_tokens: int) -> List[int]:
        owned = self.pages_of(req_id)
        need = -(-num_tokens // self.page_size) - len(owned)
        if need > 0:
            self.adopt(req_id, self.alloc(need))
        return owned

    def truncate(self, req_id: int, keep_tokens: int) -> List[int]:
        """Return the pages past ``keep_tokens`` (the rejected tail of a verified tree)."""
        owned = self.pages_of(req_id)
        keep = -(-keep_tokens // self.page_size)
        freed = owned[keep:]
        del owned[keep:]
        self._free.extend(reversed(freed))
        self._check()
        return freed

    def release(self, req_id: int) -> None:
        self._free.extend(reversed(self._owned.pop(req_id, [])))

    def _check(self) -> None:
        owned = sum(len(p) for p in self._owned.values())
        assert len(self._free) + owned + self._loose == self.num_pages - 1  # ok: FC109
