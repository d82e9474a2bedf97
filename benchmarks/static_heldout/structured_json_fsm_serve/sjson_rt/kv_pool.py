"""Paged KV pool; page 0 is a scratch page that padded graph rows point at."""
from typing import List

import torch

from sjson.config import ServerConfig


class PagedKVPool:
    def __init__(self, cfg: ServerConfig, device: torch.device, dtype: torch.dtype = torch.bfloat16):
        self.page_size = cfg.page_size
        self.num_pages = cfg.max_pages
        self.kv_data = [
            torch.zeros(self.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.free_pages: List[int] = list(range(self.num_pages - 1, 0, -1))

    def alloc(self, n: int) -> List[int]:
        if n > len(self.free_pages):
            raise RuntimeError(f"KV pool exhausted: {n} pages wanted, {len(self.free_pages)} free")
        return [self.free_pages.pop() for _ in range(n)]

    def free(self, pages: List[int]) -> None:
        self.free_pages.extend(pages)

    def usage(self) -> float:
        assert len(self.free_pages) < self.num_pages, "scratch page 0 leaked into the free list"  # ok: FC109
        return 1.0 - len(self.free_pages) / (self.num_pages - 1)
