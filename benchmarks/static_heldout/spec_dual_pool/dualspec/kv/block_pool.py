"""One pool of KV block ids for both models (each model's cache has the same number of blocks, so a block id
addresses the same slot in both) and a per-request page table with lookahead slots for the draft tokens."""
from __future__ import annotations

import collections
from typing import List

import numpy as np


class SharedBlockPool:
    def __init__(self, num_blocks: int):
        self.free = collections.deque(range(num_blocks))
        self.ref = np.zeros(num_blocks, dtype=np.int32)

    def allocate(self, n: int) -> List[int]:
        assert n <= len(self.free), "out of KV blocks"  # expect: FC109
        ids = [self.free.popleft() for _ in range(n)]
        self.ref[ids] += 1
        return ids

    def release(self, ids: List[int]) -> None:
        self.ref[ids] -= 1
        self.free.extend(i for i in ids if self.ref[i] == 0)
        self._check_refcounts()

    def _check_refcounts(self) -> None:
        assert (self.ref >= 0).all(), "a block was released twice"  # ok: FC109


class PageTable:
    """Logical page -> physical block per request row, host side; the attention states gather from it."""

    def __init__(self, max_reqs: int, max_pages: int, page_size: int):
        self.page_size = page_size
        self.table = np.full((max_reqs, max_pages), -1, dtype=np.int32)
        self.num_pages = np.zeros(max_reqs, dtype=np.int32)
        self.seq_lens = np.zeros(max_reqs, dtype=np.int32)

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max())  # ok: FC101

    def reserve_lookahead(self, rows: np.ndarray, tokens: int, pool: SharedBlockPool) -> None:
        """Make room for ``tokens`` more tokens per row (the draft tokens plus the bonus token)."""
        need = -(-(self.seq_lens[rows] + tokens) // self.page_size) - self.num_pages[rows]
        for row, n in zip(rows, need):
            if n > 0:
                self.table[row, self.num_pages[row] : self.num_pages[row] + n] = pool.allocate(int(n))
                self.num_pages[row] += n

    def rollback(self, rows: np.ndarray, new_lens: np.ndarray, pool: SharedBlockPool) -> None:
        """Commit the accepted tokens; pages holding only rejected lookahead slots go back to the pool."""
        self.seq_lens[rows] = new_lens
        keep = -(-new_lens // self.page_size)
        for row, k in zip(rows, keep):
            pool.release(self.table[row, k : self.num_pages[row]].tolist())
            self.table[row, k:], self.num_pages[row] = -1, k

    def slots(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return self.table[rows, positions // self.page_size] * self.page_size + positions % self.page_size
