"""Paged KV cache of the base model: one K and one V cache per layer, host page lists."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from loraslots.config import SlotConfig

NULL_PAGE = 0  # padded graph rows point here


class PagePool:
    def __init__(self, cfg: SlotConfig, device: torch.device) -> None:
        self.page_size = cfg.page_size
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        shape = (cfg.max_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=torch.float16, device=device) for _ in range(cfg.num_layers)]
        self.v_cache = [torch.zeros(shape, dtype=torch.float16, device=device) for _ in range(cfg.num_layers)]
        self._free: List[int] = list(range(cfg.max_pages - 1, NULL_PAGE, -1))
        self.pages: Dict[int, List[int]] = {}
        self.lens: Dict[int, int] = {}

    def kv(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_cache[layer], self.v_cache[layer]

    def num_free(self) -> int:
        return len(self._free)

    def admit(self, rid: int, num_tokens: int) -> None:
        need = (num_tokens + self.page_size - 1) // self.page_size
        if need > len(self._free):
            raise MemoryError(f"request {rid} needs {need} pages, {len(self._free)} free")
        self.pages[rid] = [self._free.pop() for _ in range(need)]
        self.lens[rid] = num_tokens

    def grow(self, rid: int) -> int:
        """Make room for one more token; returns its flat slot (page * page_size + offset)."""
        n = self.lens[rid]
        if n % self.page_size == 0:
            self.pages[rid].append(self._free.pop())
        self.lens[rid] = n + 1
        return self.pages[rid][-1] * self.page_size + n % self.page_size

    def token_slots(self, rid: int) -> List[int]:
        pages = self.pages[rid]
        return [pages[i // self.page_size] * self.page_size + i % self.page_size for i in range(self.lens[rid])]

    def release(self, rid: int) -> None:
        self._free.extend(self.pages.pop(rid, []))
        self.lens.pop(rid, None)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        self.k_cache[layer].view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, out_loc, k)
        self.v_cache[layer].view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, out_loc, v)
