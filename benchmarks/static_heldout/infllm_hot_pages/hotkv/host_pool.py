from __future__ import annotations

from typing import List

import numpy as np
import torch


class HostKVPool:
    """All KV pages of all layers, in pinned host memory: [layers, pages, 2, page, heads, dim]."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.bfloat16):
        self.page_size = page_size
        self.num_pages = num_pages
        self.kv = torch.empty(num_layers, num_pages, 2, page_size, num_kv_heads, head_dim,
                              dtype=dtype, pin_memory=True)
        self.free = list(range(num_pages - 1, -1, -1))
        self.num_free = num_pages
        self.owner = np.full(num_pages, -1, dtype=np.int64)

    def alloc(self, rid: int, n: int) -> List[int]:
        if n > self.num_free:
            raise MemoryError(f"host KV pool exhausted: need {n}, have {self.num_free}")
        pages = [self.free.pop() for _ in range(n)]
        self.owner[pages] = rid
        self.num_free -= n
        assert self.num_free >= 0  # ok: FC109
        return pages

    def release(self, pages: List[int]) -> None:
        self.owner[pages] = -1
        self.free.extend(pages)
        self.num_free += len(pages)

    def write_pages(self, layer: int, page_ids: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Offload freshly computed KV (device) of full pages to the host pool."""
        assert k.shape == v.shape, "k and v must have the same shape"  # expect: FC109
        idx = page_ids.cpu() if page_ids.is_cuda else page_ids
        self.kv[layer, idx, 0].copy_(k, non_blocking=True)
        self.kv[layer, idx, 1].copy_(v, non_blocking=True)
