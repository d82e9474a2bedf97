import numpy as np


class PageTable:
    """Host page table: row r holds the pages of the request in slot r, in natural (arrival) order."""

    def __init__(self, max_batch, max_pages_per_seq, num_pages):
        self.rows = np.zeros((max_batch, max_pages_per_seq), dtype=np.int32)
        self.num_pages = np.zeros(max_batch, dtype=np.int32)
        self.free = list(range(num_pages - 1, 0, -1))

    def grow(self, row, n):
        start = self.num_pages[row]
        for i in range(n):
            self.rows[row, start + i] = self.free.pop()
        self.num_pages[row] = start + n

    def release(self, row):
        self.free.extend(self.rows[row, : self.num_pages[row]].tolist())
        self.num_pages[row] = 0

    def flat(self, rows_np):
        pages = self.num_pages[rows_np]
        indptr = np.zeros(rows_np.shape[0] + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        indices = np.concatenate([self.rows[r, : self.num_pages[r]] for r in rows_np])
        return indptr, indices, pages
