"""Paged KV pool: a host page allocator and a device req -> page table the kernels read."""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch

from .config import EngineConfig


class PagedKVPool:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.page_size = cfg.page_size
        self._kv_layout = "NHD"
        dt = getattr(torch, cfg.dtype)
        self.kv = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=dt, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.req_to_page_np = np.zeros((cfg.max_running_requests, cfg.max_pages_per_request), dtype=np.int32)
        self.req_to_page = torch.zeros(
            cfg.max_running_requests, cfg.max_pages_per_request, dtype=torch.int32, device=device
        )
        self._free: List[int] = list(range(cfg.num_pages - 1, 0, -1))
        self._owned: Dict[int, int] = {}

    @property
    def layout(self) -> str:
        return self._kv_layout

    def free_pages(self) -> int:
        return len(self._free)

    def reserve(self, slot: int, seq_len: int) -> bool:
        have = self._owned.get(slot, 0)
        need = -(-seq_len // self.page_size)
        if need - have > len(self._free):
            return False
        for i in range(have, need):
            self.req_to_page_np[slot, i] = self._free.pop()
        if need > have:
            row = torch.from_numpy(self.req_to_page_np[slot, have:need])
            self.req_to_page[slot, have:need].copy_(row, non_blocking=True)
        self._owned[slot] = max(have, need)
        return True

    def release(self, slot: int) -> None:
        n = self._owned.pop(slot, 0)
        self._free.extend(int(p) for p in self.req_to_page_np[slot, :n][::-1])

    def slot_of(self, slot: int, pos: int) -> int:
        return int(self.req_to_page_np[slot, pos // self.page_size]) * self.page_size + pos % self.page_size
