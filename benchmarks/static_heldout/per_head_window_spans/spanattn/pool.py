"""One paged KV pool per head group.  Local groups hand pages back as their window slides."""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from spanattn.spans import HeadGroup


class SpanKVPool:
    def __init__(
        self,
        group: HeadGroup,
        num_layers: int,
        num_pages: int,
        page_size: int,
        head_dim: int,
        max_running: int,
        max_pages_per_req: int,
        device: torch.device,
        kv_layout: str = "NHD",
    ):
        self.group = group
        self.page_size = page_size
        self.num_pages = num_pages
        self._kv_layout = kv_layout
        if kv_layout == "NHD":
            shape = (num_layers, num_pages, 2, page_size, group.num_kv_heads, head_dim)
        else:
            shape = (num_layers, num_pages, 2, group.num_kv_heads, page_size, head_dim)
        self.kv = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        # logical page j of the request in slot s lives in physical page block_table_np[s, j]
        self.block_table_np = np.zeros((max_running, max_pages_per_req), dtype=np.int32)
        self.free_pages: List[int] = list(range(num_pages - 1, 0, -1))  # page 0: null page

    @property
    def kv_layout(self) -> str:
        return self._kv_layout

    def free_count(self) -> int:
        assert len(self.free_pages) < self.num_pages, "null page leaked into the free list"  # ok: FC109
        return len(self.free_pages)

    def ensure_pages(self, slot: int, seq_len: int) -> None:
        last = (seq_len - 1) // self.page_size
        row = self.block_table_np[slot]
        for j in range(last + 1):
            if row[j] == 0:
                row[j] = self.free_pages.pop()

    def release_before(self, slot: int, first_page: int) -> None:
        row = self.block_table_np[slot]
        for j in range(first_page):
            if row[j] != 0:
                self.free_pages.append(int(row[j]))
                row[j] = 0

    def release_slot(self, slot: int) -> None:
        row = self.block_table_np[slot]
        self.free_pages.extend(int(p) for p in row[row != 0])
        row[:] = 0

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        page = torch.div(loc, self.page_size, rounding_mode="floor")
        off = loc % self.page_size
        kv = self.kv[layer]
        if self._kv_layout == "NHD":
            kv[page, 0, off] = k
            kv[page, 1, off] = v
        else:
            kv[page, 0, :, off] = k
            kv[page, 1, :, off] = v
