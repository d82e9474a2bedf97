"""One paged KV pool per tier: device pages, a host free list and a numpy request-to-page table."""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from cascade.config import ModelSpec


class TierKVPool:
    def __init__(self, spec: ModelSpec, device: torch.device, max_requests: int = 512, dtype=torch.bfloat16):
        self.page_size = spec.page_size
        self.num_pages = spec.num_pages
        shape = (spec.num_pages, 2, spec.page_size, spec.num_kv_heads, spec.head_dim)
        self.kv = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
        self.free_pages: List[int] = list(range(spec.num_pages))
        self.num_used = 0
        self.page_table_np = np.zeros((max_requests, spec.max_pages_per_req), dtype=np.int32)
        self.free_slots: List[int] = list(range(max_requests))

    @property
    def num_free(self) -> int:
        return len(self.free_pages)

    def layer(self, layer_id: int) -> torch.Tensor:
        return self.kv[layer_id]

    def write(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        page, slot = loc // self.page_size, loc % self.page_size
        self.kv[layer_id][page, 0, slot] = k
        self.kv[layer_id][page, 1, slot] = v

    def claim_slot(self) -> int:
        return self.free_slots.pop()

    def alloc(self, num_pages: int) -> List[int]:
        assert num_pages <= self.num_free  # expect: FC109
        pages, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        self.num_used += num_pages
        self._check()
        return pages

    def free(self, pages: List[int], slot: int) -> None:
        self.free_pages.extend(pages)
        self.num_used -= len(pages)
        self.free_slots.append(slot)
        self._check()

    def _check(self) -> None:
        assert self.num_free + self.num_used == self.num_pages  # ok: FC109
