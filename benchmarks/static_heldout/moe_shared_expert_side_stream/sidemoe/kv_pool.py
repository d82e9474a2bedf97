"""Paged KV cache: one [pages, 2, page_size, kv_heads, head_dim] tensor per layer (NHD pages)."""

from __future__ import annotations

import torch

from sidemoe.config import ServeConfig


class PagedKVPool:
    def __init__(self, cfg: ServeConfig, device: torch.device, dtype=torch.bfloat16):
        self.page_size = cfg.page_size
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.layers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        prefix_shape = (max(cfg.sys_prompt_pages, 1), 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.sys_prefix = [torch.zeros(prefix_shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]

    def kv_buffer(self, layer_id: int) -> torch.Tensor:
        return self.layers[layer_id]

    def prefix_buffer(self, layer_id: int) -> torch.Tensor:
        return self.sys_prefix[layer_id]

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        cache = self.layers[layer_id]
        page, slot = loc // self.page_size, loc % self.page_size
        cache[page, 0, slot] = k
        cache[page, 1, slot] = v
