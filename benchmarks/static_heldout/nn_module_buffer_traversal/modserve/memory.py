"""Paged KV cache pool and the request -> page table."""

from __future__ import annotations

from typing import List, Tuple

import torch

from modserve.config import PAGE_SIZE, EngineConfig


class PagedKVPool:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        shape = (cfg.max_pages, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim)
        self.k_buffer: List[torch.Tensor] = [
            torch.zeros(shape, dtype=cfg.kv_dtype, device=device) for _ in range(cfg.num_layers)
        ]
        self.v_buffer: List[torch.Tensor] = [
            torch.zeros(shape, dtype=cfg.kv_dtype, device=device) for _ in range(cfg.num_layers)
        ]
        self.req_to_page = torch.zeros(
            cfg.max_num_reqs, cfg.pages_per_req, dtype=torch.int32, device=device
        )

    def get_kv(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv(
        self,
        layer_id: int,
        loc: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_scale: torch.Tensor,
        v_scale: torch.Tensor,
    ) -> None:
        page, off = loc // PAGE_SIZE, loc % PAGE_SIZE
        kb, vb = self.k_buffer[layer_id], self.v_buffer[layer_id]
        kb[page, off] = (k / k_scale).to(kb.dtype)
        vb[page, off] = (v / v_scale).to(vb.dtype)
