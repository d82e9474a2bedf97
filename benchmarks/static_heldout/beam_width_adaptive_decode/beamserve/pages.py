import logging
from typing import List

import numpy as np
import torch

logger = logging.getLogger(__name__)


class PagePool:
    """Paged KV pool whose pages are shared between beams of one request until they diverge."""

    def __init__(self, num_pages: int, page_size: int, max_fanout: int, device: torch.device):
        self.num_pages = num_pages
        self.page_size = page_size
        self.max_fanout = max_fanout
        self.device = device
        self.refcount_np = np.zeros(num_pages, dtype=np.int32)
        self.refcount = torch.zeros(num_pages, dtype=torch.int32, device=device)
        self.free_list: List[int] = list(range(num_pages - 1, 0, -1))
        self.null_page = 0
        self.num_free = len(self.free_list)

    def _check_free(self) -> None:
        assert self.num_free == len(self.free_list)  # ok: FC109

    def alloc(self, n: int) -> List[int]:
        if n > len(self.free_list):
            raise RuntimeError(f"out of KV pages: need {n}, have {len(self.free_list)}")
        pages = [self.free_list.pop() for _ in range(n)]
        self.refcount_np[pages] = 1
        self.num_free -= n
        self._check_free()
        return pages

    def fork(self, parent_pages: List[int], n_children: int) -> List[List[int]]:
        """Share the parent's full pages with each child; the tail page is copied on write."""
        assert n_children <= self.max_fanout  # expect: FC109
        shared = parent_pages[:-1]
        children = []
        for _ in range(n_children):
            tail = self.alloc(1)
            children.append(shared + tail)
        if shared:
            self.refcount_np[shared] += n_children
        return children

    def release(self, pages: List[int]) -> None:
        self.refcount_np[pages] -= 1
        dead = np.flatnonzero(self.refcount_np[pages] == 0)
        for i in dead.tolist():
            self.free_list.append(pages[i])
        self.num_free = len(self.free_list)
        self._check_free()

    def sync_refcounts(self) -> None:
        self.refcount.copy_(torch.from_numpy(self.refcount_np), non_blocking=True)
