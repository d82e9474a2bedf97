"""Copy-on-write page table of the beams (host side, numpy)."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

from bsf.config import BeamConfig


class CowPageTable:
    def __init__(self, cfg: BeamConfig):
        self.page_size, self.num_pages = cfg.page_size, cfg.num_pages
        self.refcount_np = np.zeros(cfg.num_pages, dtype=np.int32)
        self.free: List[int] = list(range(cfg.num_pages - 1, 0, -1))  # page 0 is the padding page
        self.block_np = np.zeros((cfg.max_rows, cfg.pages_per_seq), dtype=np.int32)
        self.num_blocks_np = np.zeros(cfg.max_rows, dtype=np.int32)
        self.seq_lens_np = np.zeros(cfg.max_rows, dtype=np.int32)
        self.shared_blocks_np = np.zeros(cfg.max_rows, dtype=np.int32)  # full prompt pages, shared by the beams
        self._kv_layout = "NHD"  # ok: FC103

    @property
    def num_free(self) -> int:
        assert len(self.free) < self.num_pages  # ok: FC109
        return len(self.free)

    def alloc(self, n: int) -> List[int]:
        if n > len(self.free):
            raise RuntimeError(f"out of KV pages: need {n}, {len(self.free)} free")
        pages = [self.free.pop() for _ in range(n)]
        self.refcount_np[pages] = 1
        return pages

    def release_row(self, row: int) -> None:
        pages = self.block_np[row, : self.num_blocks_np[row]]
        self.refcount_np[pages] -= 1
        self.free.extend(int(p) for p in pages[self.refcount_np[pages] == 0])
        self.num_blocks_np[row] = 0

    def append_page(self, row: int) -> None:
        (page,) = self.alloc(1)
        self.block_np[row, self.num_blocks_np[row]] = page
        self.num_blocks_np[row] += 1

    def set_row(self, row: int, pages: List[int], seq_len: int, shared: int) -> None:
        self.block_np[row, : len(pages)] = pages
        self.num_blocks_np[row], self.seq_lens_np[row], self.shared_blocks_np[row] = len(pages), seq_len, shared

    def fork(self, parent_rows: List[int]) -> List[Tuple[int, int, int]]:
        """Row ``i`` continues the history of row ``parent_rows[i]``. Returns (row, src_page, dst_page) for
        every last page that is partly filled and now shared: it must be copied before the next write."""
        blocks = self.block_np[parent_rows].copy()
        nblk = self.num_blocks_np[parent_rows].copy()
        lens = self.seq_lens_np[parent_rows].copy()
        shared = self.shared_blocks_np[parent_rows].copy()
        for row, (n, p) in enumerate(zip(nblk, blocks)):
            self.refcount_np[p[:n]] += 1
        for row in range(len(parent_rows)):
            self.release_row(row)
        copies = []
        for row in range(len(parent_rows)):
            n = int(nblk[row])
            self.set_row(row, blocks[row, :n].tolist(), int(lens[row]), int(shared[row]))
            last = int(blocks[row, n - 1])
            if lens[row] % self.page_size and self.refcount_np[last] > 1:
                (fresh,) = self.alloc(1)
                self.refcount_np[last] -= 1
                self.block_np[row, n - 1] = fresh
                copies.append((row, last, fresh))
        return copies
