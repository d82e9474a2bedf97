"""Paged KV cache for the (few) attention layers of the hybrid model."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from jamba.config import JambaConfig


class PagedKVPool:
    def __init__(self, cfg: JambaConfig, num_attn_layers: int, device: torch.device, dtype: torch.dtype):
        self.page_size = cfg.page_size
        self.num_pages = cfg.num_kv_pages
        self.device = device
        shape = (cfg.num_kv_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_data = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_attn_layers)]
        self.free_pages: List[int] = list(range(cfg.num_kv_pages - 1, -1, -1))
        self.req_to_pages: Dict[str, List[int]] = {}

    def reserve(self, rid: str, num_tokens: int) -> List[int]:
        pages = self.req_to_pages.setdefault(rid, [])
        need = (num_tokens + self.page_size - 1) // self.page_size - len(pages)
        if need > len(self.free_pages):
            raise MemoryError(f"KV pool exhausted: need {need} pages, {len(self.free_pages)} free")
        for _ in range(max(need, 0)):
            pages.append(self.free_pages.pop())
        return pages

    def pages_of(self, rid: str) -> List[int]:
        return self.req_to_pages.get(rid, [])

    def flat_page_ids(self, rids: List[str]) -> List[int]:
        out: List[int] = []
        for rid in rids:
            out.extend(self.req_to_pages.get(rid, []))
        return out

    def flat_prefix_page_ids(self, rids: List[str], prefix_lens: List[int]) -> List[int]:
        out: List[int] = []
        for rid, n in zip(rids, prefix_lens):
            out.extend(self.req_to_pages.get(rid, [])[: (n + self.page_size - 1) // self.page_size])
        return out

    def release(self, rid: str) -> List[int]:
        pages = self.req_to_pages.pop(rid, [])
        self.free_pages.extend(pages)
        return pages

    def get_kv_buffer(self, attn_idx: int) -> torch.Tensor:
        return self.kv_data[attn_idx]

    def set_kv_buffer(self, attn_idx: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        buf = self.kv_data[attn_idx]
        page = loc // self.page_size
        off = loc % self.page_size
        buf[page, 0, off] = k
        buf[page, 1, off] = v

    def compact(self) -> Optional[torch.Tensor]:
        """Moves live pages to the front of the pool.

        Returns the old-to-new page id map on the device, or ``None`` when the
        pool is dense enough already.
        """
        live = sorted(p for pages in self.req_to_pages.values() for p in pages)
        if not live or live[-1] < 2 * len(live):
            return None
        remap_host = torch.arange(self.num_pages, dtype=torch.int32)
        for new, old in enumerate(live):
            remap_host[old] = new
        src = torch.tensor(live, dtype=torch.int64, device=self.device)
        dst = torch.arange(len(live), dtype=torch.int64, device=self.device)
        for buf in self.kv_data:
            buf[dst] = buf[src]
        for pages in self.req_to_pages.values():
            pages[:] = [int(remap_host[p]) for p in pages]
        self.free_pages = list(range(self.num_pages - 1, len(live) - 1, -1))
        return remap_host.to(self.device, non_blocking=True)
