"""Paged KV cache: one K and one V tensor per layer, addressed by page id."""

from __future__ import annotations

from typing import Tuple

import torch

from opserve.config import EngineConfig


class PagedKVPool:
    def __init__(self, cfg: EngineConfig, num_pages: int, device: torch.device):
        self.page_size = cfg.page_size
        self.num_pages = num_pages
        shape = (num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_buffers = [torch.zeros(shape, dtype=cfg.kv_dtype, device=device) for _ in range(cfg.num_layers)]
        self.v_buffers = [torch.zeros(shape, dtype=cfg.kv_dtype, device=device) for _ in range(cfg.num_layers)]
        # req_to_page[req_pool_idx, i] is the i-th page of that request.
        self.req_to_page = torch.zeros(
            cfg.max_batch_size, cfg.max_pages_per_request(), dtype=torch.int32, device=device
        )
        self.free_pages = torch.ones(num_pages, dtype=torch.bool, device=device)

    def kv_buffer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        page = torch.div(loc, self.page_size, rounding_mode="floor")
        slot = loc - page * self.page_size
        k_buf, v_buf = self.kv_buffer(layer_id)
        k_buf[page, slot] = k.to(k_buf.dtype)
        v_buf[page, slot] = v.to(v_buf.dtype)
