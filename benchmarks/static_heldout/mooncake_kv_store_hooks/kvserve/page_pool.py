"""Local paged KV cache (HND per layer) and its host free list."""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from kvstore.config import StoreConfig


class LocalPagePool:
    def __init__(self, cfg: StoreConfig, num_pages: int, device: torch.device, dtype: torch.dtype = torch.float16):
        self.cfg = cfg
        self.num_pages = num_pages
        self.kv_dtype = dtype
        # [layer, page, 2, kv_head, page_size, head_dim]; page 0 is the null page padded rows read
        self.kv_cache = torch.zeros(
            cfg.num_layers, num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=dtype, device=device
        )
        self._free: List[int] = list(range(num_pages - 1, 0, -1))

    @property
    def page_bytes(self) -> int:
        """Bytes of one page over every layer: the unit the store keeps under one key."""
        per_layer = 2 * self.cfg.num_kv_heads * self.cfg.page_size * self.cfg.head_dim
        return self.cfg.num_layers * per_layer * self.kv_cache.element_size()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def layer(self, layer_id: int) -> torch.Tensor:
        return self.kv_cache[layer_id]

    def alloc(self, n: int) -> np.ndarray:
        if n > len(self._free):
            raise MemoryError(f"need {n} KV pages, {len(self._free)} free")
        return np.array([self._free.pop() for _ in range(n)], dtype=np.int32)

    def release(self, pages: np.ndarray) -> None:
        self._free.extend(pages.tolist())
