"""The quantized page pool: packed INT4 pages for most layers, FP8 pages for a few."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from qkv.config import QuantKVConfig


class Int4PagePool:
    def __init__(self, cfg: QuantKVConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        int4_layers = [i for i in range(cfg.num_layers) if i not in cfg.fp8_layers]
        self.layer_slot = {layer: i for i, layer in enumerate(int4_layers)}
        self.packed = torch.zeros(
            (len(int4_layers), cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim // 2),
            dtype=torch.uint8,
            device=device,
        )
        self.fp8: Dict[int, torch.Tensor] = {
            layer: torch.zeros(
                (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim), dtype=torch.float8_e4m3fn, device=device
            )
            for layer in cfg.fp8_layers
        }
        self.free: List[int] = list(range(cfg.num_pages - 1, -1, -1))
        self.req_pages: Dict[str, List[int]] = {}
        self.req_len: Dict[str, int] = {}

    def num_free(self) -> int:
        return len(self.free)

    def allocate(self, rid: str, num_tokens: int) -> List[int]:
        need = (num_tokens + self.page_size - 1) // self.page_size
        if need > len(self.free):
            raise MemoryError(f"request {rid} needs {need} pages, {len(self.free)} free")
        pages = [self.free.pop() for _ in range(need)]
        self.req_pages[rid] = pages
        self.req_len[rid] = num_tokens
        return pages

    def append_token(self, rid: str) -> Optional[int]:
        """Accounts one more token; returns the id of a newly opened page, if any."""
        n = self.req_len[rid]
        self.req_len[rid] = n + 1
        if n % self.page_size:
            return None
        page = self.free.pop()
        self.req_pages[rid].append(page)
        return page

    def append_slot(self, rid: str) -> int:
        n = self.req_len[rid] - 1
        return self.req_pages[rid][n // self.page_size] * self.page_size + n % self.page_size

    def pages(self, rid: str) -> List[int]:
        return self.req_pages[rid]

    def seq_len(self, rid: str) -> int:
        return self.req_len[rid]

    def release(self, rid: str) -> List[int]:
        pages = self.req_pages.pop(rid)
        self.req_len.pop(rid)
        self.free.extend(pages)
        self._audit()
        return pages

    def int4_layer(self, layer_id: int) -> torch.Tensor:
        return self.packed[self.layer_slot[layer_id]]

    def _audit(self) -> None:
        assert len(self.free) + sum(len(p) for p in self.req_pages.values()) == self.cfg.num_pages  # ok: FC109
