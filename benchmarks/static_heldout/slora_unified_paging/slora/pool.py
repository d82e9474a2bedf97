"""One device page pool for KV pages and adapter weight pages."""

import numpy as np
import torch

from slora.config import SLoRAConfig

KIND_FREE, KIND_KV, KIND_ADAPTER = 0, 1, 2


class UnifiedPagePool:
    def __init__(self, cfg: SLoRAConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.pages = torch.empty(
            (cfg.num_layers, cfg.pool_pages, cfg.page_elems), dtype=torch.bfloat16, device=self.device
        )
        self.kind_np = np.zeros(cfg.pool_pages, dtype=np.int8)
        self.owner_np = np.full(cfg.pool_pages, -1, dtype=np.int64)
        self.last_use_np = np.zeros(cfg.pool_pages, dtype=np.int64)
        self.preempted_np = np.zeros(cfg.pool_pages, dtype=bool)

    def num_free(self) -> int:
        return int(np.count_nonzero(self.kind_np == KIND_FREE))

    def alloc(self, n: int, kind: int, owner: int) -> np.ndarray:
        free = np.flatnonzero(self.kind_np == KIND_FREE)
        if free.size < n:
            raise MemoryError(f"unified pool: need {n} pages, {free.size} free")
        pages = free[:n]
        self.kind_np[pages] = kind
        self.owner_np[pages] = owner
        return pages.astype(np.int64)

    def evict_kv(self, n: int) -> np.ndarray:
        """Take back the least recently used KV pages of preempted requests."""
        cand = np.flatnonzero((self.kind_np == KIND_KV) & self.preempted_np)
        if cand.size < n:
            raise MemoryError(f"unified pool: only {cand.size} evictable KV pages, {n} needed")
        victims = cand[np.argsort(self.last_use_np[cand])[:n]]
        self.release(victims)
        return victims.astype(np.int64)

    def release(self, pages: np.ndarray) -> None:
        self.kind_np[pages] = KIND_FREE
        self.owner_np[pages] = -1
        self.preempted_np[pages] = False

    def kv_layer(self, layer: int) -> torch.Tensor:
        c = self.cfg
        return self.pages[layer].view(c.pool_pages, 2, c.page_size, c.num_kv_heads, c.head_dim)
