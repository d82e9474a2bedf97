"""Host-side paged KV bookkeeping: page pool, per-row page lists, truncation."""

from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

import numpy as np

from specroll.config import SpecConfig


class PagePool:
    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self.free_list: List[int] = list(range(num_pages - 1, -1, -1))
        self.num_used = 0

    def alloc(self, n: int) -> List[int]:
        if n > len(self.free_list):
            raise MemoryError(f"need {n} pages, {len(self.free_list)} free")
        out = [self.free_list.pop() for _ in range(n)]
        self.num_used += n
        return out

    def free(self, pages: Sequence[int]) -> None:
        assert len(pages) <= self.num_used  # expect: FC109
        self.free_list.extend(pages)
        self.num_used -= len(pages)
        self._check_counts()

    def _check_counts(self) -> None:
        assert 0 <= self.num_used <= self.num_pages, "page accounting out of range"  # ok: FC109


@dataclasses.dataclass
class RowState:
    request_id: int
    pages: List[int]
    seq_len: int


class PagedKVState:
    """Page lists of the running rows; the device copies live in the backend."""

    def __init__(self, cfg: SpecConfig, pool: PagePool):
        self.cfg = cfg
        self.pool = pool
        self.rows: List[RowState] = []

    def reserve(self, row: int, extra_tokens: int) -> None:
        st = self.rows[row]
        need = -(-(st.seq_len + extra_tokens) // self.cfg.page_size) - len(st.pages)
        if need > 0:
            st.pages.extend(self.pool.alloc(need))
        st.seq_len += extra_tokens

    def truncate(self, row: int, num_tokens: int) -> List[int]:
        """Drop the last ``num_tokens`` tokens of ``row``; return the pages freed."""
        st = self.rows[row]
        st.seq_len -= num_tokens
        keep = -(-st.seq_len // self.cfg.page_size)
        freed = st.pages[keep:]
        del st.pages[keep:]
        return freed

    def page_table(self, rows: Sequence[int]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        counts = np.array([len(self.rows[r].pages) for r in rows], dtype=np.int32)
        indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.fromiter((p for r in rows for p in self.rows[r].pages), dtype=np.int32, count=int(indptr[-1]))
        lens = np.array([self.rows[r].seq_len for r in rows], dtype=np.int32)
        last = ((lens - 1) % self.cfg.page_size + 1).astype(np.int32)
        return indptr, indices, last

    def seq_lens(self, rows: Sequence[int]) -> np.ndarray:
        return np.array([self.rows[r].seq_len for r in rows], dtype=np.int32)
