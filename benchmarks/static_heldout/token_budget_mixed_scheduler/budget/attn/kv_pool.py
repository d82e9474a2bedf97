"""The paged KV pool shared by every layer."""

from typing import List

import torch

from ..config import BudgetConfig


class PagedKVPool:
    def __init__(self, cfg: BudgetConfig) -> None:
        self._kv_layout = "NHD"
        self.kv_caches = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=cfg.device)
            for _ in range(cfg.num_layers)
        ]
        self._free: List[int] = list(range(cfg.num_pages - 1, 0, -1))

    @property
    def layout(self) -> str:
        return self._kv_layout

    def alloc(self, n: int) -> List[int]:
        if n > len(self._free):
            raise MemoryError(f"KV pool exhausted: need {n} pages, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: List[int]) -> None:
        self._free.extend(pages)
        pages.clear()
