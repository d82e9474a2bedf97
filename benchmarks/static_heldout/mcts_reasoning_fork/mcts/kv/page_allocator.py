"""Refcounted KV pages: children share their parent's full pages and copy its partial last page."""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch


class PageAllocator:
    def __init__(self, num_pages: int, page_size: int, device: torch.device) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = device
        self.refcount = np.zeros(num_pages, dtype=np.int32)
        self.free = deque(range(num_pages))
        self.num_used = 0
        self.pending_copies: List[Tuple[int, int]] = []
        self.copy_src_cpu = torch.zeros(4096, dtype=torch.int64, pin_memory=True)
        self.copy_dst_cpu = torch.zeros(4096, dtype=torch.int64, pin_memory=True)

    def _check_conservation(self) -> None:
        assert len(self.free) + self.num_used == self.num_pages, "page accounting drifted"  # ok: FC109

    def alloc(self, n: int) -> List[int]:
        if len(self.free) < n:
            raise MemoryError(f"need {n} pages, {len(self.free)} free")
        pages = [self.free.popleft() for _ in range(n)]
        self.refcount[pages] = 1
        self.num_used += n
        return pages

    def fork(self, pages: Sequence[int], seq_len: int) -> List[int]:
        """Child page list: shared full pages, a private copy of the partial last page."""
        assert seq_len <= len(pages) * self.page_size, "sequence longer than its pages"  # expect: FC109
        full = seq_len // self.page_size
        child = list(pages[:full])
        self.refcount[child] += 1
        if seq_len % self.page_size:
            (dst,) = self.alloc(1)
            self.pending_copies.append((pages[full], dst))
            child.append(dst)
        return child

    def release(self, pages: Sequence[int]) -> None:
        for p in pages:
            self.refcount[p] -= 1
            if self.refcount[p] == 0:
                self.free.append(p)
                self.num_used -= 1
        self._check_conservation()

    def rollback(self, pages: List[int], new_len: int) -> List[int]:
        """Drop the pages past ``new_len`` tokens; returns the kept list."""
        keep = (new_len + self.page_size - 1) // self.page_size
        self.release(pages[keep:])
        return pages[:keep]

    def flush_copies(self, kv_caches: Sequence[torch.Tensor]) -> None:
        n = len(self.pending_copies)
        if n == 0:
            return
        src = np.array([s for s, _ in self.pending_copies], dtype=np.int64)
        dst = np.array([d for _, d in self.pending_copies], dtype=np.int64)
        self.copy_src_cpu[:n] = torch.from_numpy(src)
        self.copy_dst_cpu[:n] = torch.from_numpy(dst)
        src_dev = self.copy_src_cpu[:n].to(self.device, non_blocking=True)
        dst_dev = self.copy_dst_cpu[:n].to(self.device, non_blocking=True)
        for kv in kv_caches:
            kv.index_copy_(0, dst_dev, kv.index_select(0, src_dev))
        self.pending_copies.clear()
