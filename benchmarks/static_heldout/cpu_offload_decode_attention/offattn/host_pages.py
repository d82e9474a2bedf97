"""Old pages in pinned host memory, per request oldest first."""

from __future__ import annotations

from typing import Dict, List

import torch

from offattn.config import OffloadConfig


class HostPageStore:
    def __init__(self, cfg: OffloadConfig):
        self.num_pages = cfg.host_pages
        shape = (cfg.host_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.empty(shape, dtype=torch.bfloat16, pin_memory=True) for _ in range(cfg.num_layers)]
        self.v = [torch.empty(shape, dtype=torch.bfloat16, pin_memory=True) for _ in range(cfg.num_layers)]
        self.free: List[int] = list(range(cfg.host_pages))
        self.tables: Dict[int, List[int]] = {}
        self.used = 0

    def take(self, n: int) -> List[int]:
        if n > len(self.free):
            raise MemoryError(f"host KV store full: need {n}, have {len(self.free)}")
        out, self.free = self.free[:n], self.free[n:]
        self.used += n
        self._check()
        return out

    def append(self, rid: int, pages: List[int]) -> None:
        self.tables.setdefault(rid, []).extend(pages)

    def host_len(self, rid: int) -> int:
        return len(self.tables.get(rid, ()))

    def drop(self, rid: int) -> None:
        pages = self.tables.pop(rid, [])
        self.free.extend(pages)
        self.used -= len(pages)
        self._check()

    def _check(self) -> None:
        assert len(self.free) + self.used == self.num_pages  # ok: FC109
