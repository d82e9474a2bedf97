"""Page allocator of the paged KV cache."""

import numpy as np
import torch

from kvdefrag.config import DefragConfig


class PagePool:
    """A host owner map (numpy) with its device mirror, and the KV cache the pages live in."""

    def __init__(self, cfg: DefragConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.num_pages = cfg.num_pages
        self.owner_np = np.full(cfg.num_pages, -1, dtype=np.int32)
        self.owner_gpu = torch.full((cfg.num_pages,), -1, dtype=torch.int32, device=self.device)
        self.kv_cache = torch.empty(
            (cfg.num_layers, cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim),
            dtype=torch.bfloat16,
            device=self.device,
        )
        self._kv_layout = "NHD"
        self.high_water = 0

    def alloc(self, owner: int, n: int) -> np.ndarray:
        free = np.flatnonzero(self.owner_np < 0)
        if free.size < n:
            raise MemoryError(f"need {n} pages, {free.size} free")
        pages = free[:n].astype(np.int32)
        self.owner_np[pages] = owner
        self.high_water = max(self.high_water, int(pages[-1]) + 1)
        return pages

    def release(self, pages: np.ndarray) -> None:
        self.owner_np[pages] = -1
        live = np.flatnonzero(self.owner_np >= 0)
        self.high_water = int(live[-1]) + 1 if live.size else 0

    def sync_owner_mirror(self) -> None:
        self.owner_gpu.copy_(torch.from_numpy(self.owner_np), non_blocking=True)

    def fragmentation_host(self) -> float:
        if self.high_water == 0:
            return 0.0
        holes = np.count_nonzero(self.owner_np[: self.high_water] < 0)
        return holes / self.high_water
