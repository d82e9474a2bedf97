"""Host page tables and the per-step layout derived from them."""
from __future__ import annotations

import dataclasses

import numpy as np

from tokheal.config import HealConfig


@dataclasses.dataclass
class PageLayout:
    indptr: np.ndarray
    indices: np.ndarray
    last_page_len: np.ndarray

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    @classmethod
    def dummy(cls, bs: int) -> "PageLayout":
        return cls(
            indptr=np.arange(bs + 1, dtype=np.int32),
            indices=np.zeros(bs, dtype=np.int32),
            last_page_len=np.ones(bs, dtype=np.int32),
        )


class HostPageTable:
    def __init__(self, cfg: HealConfig) -> None:
        self.cfg = cfg
        self.table = np.zeros((cfg.max_rows, cfg.max_pages_per_req), dtype=np.int32)
        self.free = list(range(cfg.num_pages - 1, 0, -1))

    def layout(self, rows: np.ndarray, lens: np.ndarray, extra: int = 0) -> PageLayout:
        ps = self.cfg.page_size
        total = lens + extra
        pages = (total + ps - 1) // ps
        indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        parts = [self.table[r, :p] for r, p in zip(rows, pages)]
        indices = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, dtype=np.int32)
        last = (total - (pages - 1) * ps).astype(np.int32)
        return PageLayout(indptr=indptr, indices=indices, last_page_len=last)

    def ensure_pages(self, row: int, length: int) -> None:
        ps = self.cfg.page_size
        need = (length + ps - 1) // ps
        have = int(np.count_nonzero(self.table[row]))
        for p in range(have, need):
            self.table[row, p] = self.free.pop()
