from __future__ import annotations

from typing import List

import torch

from .constants import GLOBAL_PAGE_SIZE, LOCAL_PAGE_SIZE


class KVPool:
    def __init__(self, kind, num_layers, num_pages, page_size, num_kv_heads, head_dim, dtype, device):
        assert page_size in (LOCAL_PAGE_SIZE, GLOBAL_PAGE_SIZE), "unsupported page size"  # expect: FC109
        self.kind, self.page_size, self.num_pages = kind, page_size, num_pages
        self.kv_data = torch.zeros(num_layers, num_pages, 2, page_size, num_kv_heads, head_dim, dtype=dtype, device=device)
        # page 0 stays reserved as the padding page
        self._free: List[int] = list(range(num_pages - 1, 0, -1))
        self.num_free = len(self._free)

    def layer_cache(self, slot: int) -> torch.Tensor:
        return self.kv_data[slot]

    def alloc(self, n: int) -> List[int]:
        if n > len(self._free):
            raise RuntimeError(f"{self.kind} pool exhausted: need {n}, have {len(self._free)}")
        pages = [self._free.pop() for _ in range(n)]
        self.num_free = len(self._free)
        self._check_invariants()
        return pages

    def free(self, pages: List[int]) -> None:
        self._free.extend(pages)
        self.num_free = len(self._free)
        self._check_invariants()

    def _check_invariants(self) -> None:
        assert self.num_free == len(self._free) < self.num_pages  # ok: FC109


class PageTable:
    """Per-row page ids of one pool: a device copy for kernels, a pinned mirror for plans."""
    def __init__(self, pool: KVPool, max_rows: int, max_pages_per_row: int, device):
        self.pool, self.max_pages_per_row = pool, max_pages_per_row
        self.page_ids = torch.zeros(max_rows, max_pages_per_row, dtype=torch.int32, device=device)
        self.page_counts = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.page_ids_cpu = torch.zeros(max_rows, max_pages_per_row, dtype=torch.int32, pin_memory=True)
        self.page_counts_cpu = torch.zeros(max_rows, dtype=torch.int32, pin_memory=True)
        self.page_ids_np = self.page_ids_cpu.numpy()
        self.page_counts_np = self.page_counts_cpu.numpy()
        self.num_rows = 0

    @property
    def max_pages_in_use(self) -> int:
        return int(self.page_counts[: self.num_rows].max())  # expect: FC101

    def set_row(self, row: int, pages: List[int]) -> None:
        n = len(pages)
        self.page_ids_np[row, :n] = pages
        self.page_counts_np[row] = n

    def commit(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self.page_ids[:num_rows].copy_(self.page_ids_cpu[:num_rows], non_blocking=True)
        self.page_counts[:num_rows].copy_(self.page_counts_cpu[:num_rows], non_blocking=True)
