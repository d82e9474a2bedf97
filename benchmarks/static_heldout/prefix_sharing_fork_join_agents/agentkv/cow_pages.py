"""Copy-on-write paged KV pool shared by the branches of a fork."""

from typing import List

import numpy as np
import torch


class CowPagePool:
    """Pages are shared by reference between a conversation prefix and its branches.

    The reference counts live on the device (the tool-result extend decrements and copies
    them without a round trip) and are mirrored on the host for the allocator.
    A reserve of spare pages at the top of the pool receives device-side COW copies.
    """

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_fanout: int,
        num_spare_pages: int,
        device,
        dtype=torch.bfloat16,
    ):
        self.num_pages = num_pages
        self.page_size = page_size
        self.max_fanout = max_fanout
        self.device = device
        self._kv_layout = "NHD"
        # one [pages, 2, page_size, kv_heads, head_dim] tensor per layer (FlashInfer NHD)
        self.kv_cache = [
            torch.zeros((num_pages, 2, page_size, num_kv_heads, head_dim), dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self.refcounts = torch.zeros(num_pages, dtype=torch.int32, device=device)
        self.refcounts_host = np.zeros(num_pages, dtype=np.int32)
        first_spare = num_pages - num_spare_pages
        self.spare_pages = torch.arange(first_spare, num_pages, dtype=torch.int64, device=device)
        # page 0 is the null page that padding rows point at
        self._free: List[int] = list(range(first_spare - 1, 0, -1))
        self.cow_dst = None

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> np.ndarray:
        if n > len(self._free):
            raise RuntimeError(f"out of KV pages: need {n}, have {len(self._free)}")
        pages = np.array([self._free.pop() for _ in range(n)], dtype=np.int32)
        self.refcounts_host[pages] = 1
        idx = torch.from_numpy(pages.astype(np.int64)).to(self.device, non_blocking=True)
        self.refcounts.index_fill_(0, idx, 1)
        return pages

    def fork(self, prefix_pages: np.ndarray, tool_calls: list) -> List[np.ndarray]:
        """Share the conversation prefix with one new branch per tool call."""
        fanout = len(tool_calls)
        assert 0 < fanout <= self.max_fanout, "tool-call fan-out out of range"  # expect: FC109
        self.refcounts_host[prefix_pages] += fanout
        idx = torch.from_numpy(prefix_pages.astype(np.int64)).to(self.device, non_blocking=True)
        self.refcounts.index_add_(0, idx, torch.full(idx.shape, fanout, dtype=torch.int32, device=self.device))
        return [prefix_pages.copy() for _ in range(fanout)]

    def copy_page(self, src: int, dst: int) -> None:
        for layer_cache in self.kv_cache:
            layer_cache[dst].copy_(layer_cache[src], non_blocking=True)

    def release(self, pages: np.ndarray) -> None:
        self.refcounts_host[pages] -= 1
        dead = pages[self.refcounts_host[pages] == 0]
        self._free.extend(int(p) for p in dead)
        idx = torch.from_numpy(pages.astype(np.int64)).to(self.device, non_blocking=True)
        self.refcounts.index_add_(0, idx, torch.full(idx.shape, -1, dtype=torch.int32, device=self.device))
        self._check_free()

    def find_cow_rows(self, last_pages_host: np.ndarray) -> np.ndarray:
        """Rows whose last page is still shared must copy it before they append to it."""
        return np.flatnonzero(self.refcounts_host[last_pages_host] > 1)  # ok: FC101

    def resolve_writes(self, write_pages: torch.Tensor) -> torch.Tensor:
        """Device-side COW for the pages a tool-result extend appends into.

        Joins decrement the device reference counts before the host mirror learns about
        them, so the extend re-derives the shared rows from the device counts.
        """
        shared = self.refcounts[write_pages] > 1
        rows = shared.nonzero().squeeze(1)  # expect: FC101
        n = rows.numel()
        if self.cow_dst is None or self.cow_dst.numel() < n:
            self.cow_dst = torch.empty(max(n, 64), dtype=torch.int64, device=self.device)  # expect: FC107
        dst = self.cow_dst[:n]
        dst.copy_(self.spare_pages[:n])
        src = write_pages.index_select(0, rows)
        for layer_cache in self.kv_cache:
            layer_cache.index_copy_(0, dst, layer_cache.index_select(0, src))
        write_pages.index_copy_(0, rows, dst)
        self.refcounts.index_add_(0, src, torch.full_like(src, -1, dtype=torch.int32))
        return rows

    def _check_free(self) -> None:
        assert len(self._free) < self.num_pages, "free list holds more pages than the pool"  # ok: FC109
