"""Per-GPU KV pool, page allocator and page table (numpy, with a device mirror for trtllm-gen)."""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np
import torch

from gpumig.limits import MigrationLimits

NULL_PAGE = 0


class KVPool:
    def __init__(self, limits: MigrationLimits, device: torch.device) -> None:
        shape = (limits.num_pages, 2, limits.page_size, limits.num_kv_heads, limits.head_dim)
        self.kv = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(limits.num_layers)]
        self.page_size = limits.page_size

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        page, off = loc // self.page_size, loc % self.page_size
        self.kv[layer][page, 0, off] = k
        self.kv[layer][page, 1, off] = v


class PageAllocator:
    def __init__(self, num_pages: int) -> None:
        self._free: List[int] = list(range(num_pages - 1, NULL_PAGE, -1))

    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> List[int]:
        if n > len(self._free):
            raise MemoryError(f"{n} pages requested, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def give_back(self, pages: Sequence[int]) -> None:
        self._free.extend(pages)


class DevicePageTable:
    def __init__(self, limits: MigrationLimits, device: torch.device) -> None:
        self.device = device
        self.page_size = limits.page_size
        self.table_np = np.zeros((limits.max_batch, limits.max_pages_per_req), dtype=np.int32)
        self.table_dev = torch.zeros((limits.max_batch, limits.max_pages_per_req), dtype=torch.int32, device=device)
        self.pages: Dict[int, List[int]] = {}
        self.lens: Dict[int, int] = {}
        self.rows: Dict[int, int] = {}
        self._free_rows = list(range(limits.max_batch - 1, -1, -1))
        self._kv_layout = "NHD"

    def add(self, rid: int, pages: List[int], length: int) -> int:
        row = self._free_rows.pop()
        self.rows[rid] = row
        self.pages[rid] = list(pages)
        self.lens[rid] = length
        self._write_row(rid)
        return row

    def set_pages(self, rid: int, pages: List[int]) -> None:
        self.pages[rid] = list(pages)
        self._write_row(rid)

    def remove(self, rid: int) -> List[int]:
        self._free_rows.append(self.rows.pop(rid))
        self.lens.pop(rid)
        return self.pages.pop(rid)

    def _write_row(self, rid: int) -> None:
        row, pages = self.rows[rid], self.pages[rid]
        self.table_np[row, : len(pages)] = pages
        self.table_np[row, len(pages) :] = NULL_PAGE

    def push_rows(self, rids: Sequence[int]) -> None:
        rows = np.array([self.rows[r] for r in rids], dtype=np.int64)
        staged = torch.from_numpy(self.table_np[rows]).pin_memory()
        width = staged.shape[1]
        self.table_dev[:, :width].index_copy_(0, torch.from_numpy(rows).to(self.device), staged.to(self.device))
