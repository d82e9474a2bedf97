"""One KV pool for both workers. ``semipd.kvpool`` is a namespace folder shared with the offload plugin."""

from __future__ import annotations

from typing import List

import numpy as np
import torch

_NULL_PAGE = 0
assert _NULL_PAGE == 0, "padded decode rows point at page 0"  # ok: FC109


class UnifiedKVPool:
    def __init__(self, num_pages: int, page_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 device: torch.device, dtype=torch.bfloat16):
        self.num_pages = num_pages
        self.page_size = page_size
        self.kv = [
            torch.zeros(num_pages, 2, page_size, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self.free_np = np.arange(num_pages - 1, _NULL_PAGE, -1, dtype=np.int32)
        self.num_free = num_pages - 1

    @property
    def used_pages(self) -> int:
        return self.num_pages - 1 - self.num_free

    def alloc(self, n: int) -> List[int]:
        assert n <= self.num_free, "KV pool exhausted"  # expect: FC109
        pages = self.free_np[self.num_free - n : self.num_free].tolist()  # ok: FC101
        self.num_free -= n
        return pages

    def free(self, pages: List[int]) -> None:
        n = len(pages)
        self.free_np[self.num_free : self.num_free + n] = pages
        self.num_free += n

    def layer_kv(self, layer_id: int) -> torch.Tensor:
        return self.kv[layer_id]

    def write(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        cache = self.kv[layer_id]
        ps = self.page_size
        cache[slots // ps, 0, slots % ps] = k
        cache[slots // ps, 1, slots % ps] = v
