"""Paged KV cache: one ``[num_pages, 2, page_size, kv_heads, head_dim]`` tensor per layer."""

from __future__ import annotations

from typing import List

import torch

from .config import EngineConfig


class PagedKVPool:
    def __init__(self, cfg: EngineConfig) -> None:
        self.page_size = cfg.page_size
        self.num_pages = cfg.num_pages
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache: List[torch.Tensor] = [
            torch.zeros(shape, dtype=cfg.dtype, device=cfg.device) for _ in range(cfg.num_layers)
        ]

    def layer_cache(self, layer_id: int) -> torch.Tensor:
        return self.kv_cache[layer_id]

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        cache = self.kv_cache[layer_id]
        page = torch.div(loc, self.page_size, rounding_mode="floor")
        offset = loc - page * self.page_size
        cache[page, 0, offset] = k
        cache[page, 1, offset] = v
