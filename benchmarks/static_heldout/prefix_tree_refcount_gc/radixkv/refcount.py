import threading

import numpy as np


class PageRefCounter:
    """Reference counts per KV page. Pages whose count drops to zero wait in `pending_free` for the collector."""

    def __init__(self, num_pages, device):
        self.counts = np.zeros(num_pages, dtype=np.int32)
        self.free_list = list(range(num_pages - 1, 0, -1))  # page 0 is the null page
        self.pending_free = []
        self.device = device
        self.lock = threading.Lock()

    def alloc(self, n):
        if n > len(self.free_list):
            raise MemoryError(f"need {n} KV pages, {len(self.free_list)} free")
        pages = [self.free_list.pop() for _ in range(n)]
        self.counts[pages] = 1
        return pages

    def incref(self, pages):
        np.add.at(self.counts, np.asarray(pages, dtype=np.int64), 1)

    def decref(self, pages):
        idx = np.asarray(pages, dtype=np.int64)
        assert (self.counts[idx] > 0).all()  # expect: FC109
        np.subtract.at(self.counts, idx, 1)
        dead = idx[self.counts[idx] == 0]
        with self.lock:
            self.pending_free.extend(dead.tolist())

    def num_free(self):
        return len(self.free_list)
