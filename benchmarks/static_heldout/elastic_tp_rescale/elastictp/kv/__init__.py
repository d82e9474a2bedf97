"""KV pages sharded by KV head, and the host page table every degree shares."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch

from elastictp.limits import EngineLimits
from elastictp.topology import ModelDims, TPLayout


class ShardedKVCache:
    def __init__(self, dims: ModelDims, limits: EngineLimits, layout: TPLayout, device: torch.device) -> None:
        self.layout = layout
        self.page_size = limits.page_size
        shape = (limits.num_pages, 2, limits.page_size, layout.kv_heads, dims.head_dim)
        self.pages: List[torch.Tensor] = [
            torch.zeros(shape, dtype=limits.dtype, device=device) for _ in range(dims.num_layers)
        ]

    def shard_sizes(self) -> List[int]:
        return [p.shape[3] for p in self.pages]

    def append(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        page = torch.div(out_loc, self.page_size, rounding_mode="floor")
        slot = out_loc - page * self.page_size
        self.pages[layer_id][page, 0, slot] = k
        self.pages[layer_id][page, 1, slot] = v


class HostPages:
    def __init__(self, limits: EngineLimits, max_rows: int) -> None:
        self.limits = limits
        self.table = np.zeros((max_rows, limits.max_pages_per_req), dtype=np.int32)
        self.num_pages = np.zeros(max_rows, dtype=np.int32)

    def layout(self, rows: np.ndarray, lens: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        ps = self.limits.page_size
        pages = (lens + ps - 1) // ps
        indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        parts = [self.table[r, :p] for r, p in zip(rows, pages)]
        indices = np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, dtype=np.int32)
        last = (lens - (pages - 1) * ps).astype(np.int32)
        return indptr, indices, last

    def compact(self) -> np.ndarray:
        """Renumber live pages densely (the resharded pool is allocated compact)."""
        live = np.unique(self.table[self.table > 0])
        remap = np.zeros(self.limits.num_pages, dtype=np.int32)
        remap[live] = np.arange(1, live.size + 1, dtype=np.int32)
        self.table = remap[self.table]
        return remap

    def live_indices_np(self, rows: np.ndarray) -> np.ndarray:
        parts = [self.table[r, : self.num_pages[r]] for r in rows]
        return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, dtype=np.int32)
