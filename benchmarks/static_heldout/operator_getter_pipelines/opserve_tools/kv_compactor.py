"""Page compaction: moves live KV pages from the top of the pool into the holes below."""

from __future__ import annotations

import dataclasses
import functools
from typing import List, Optional

import torch


@dataclasses.dataclass
class PageMoves:
    src: torch.Tensor
    dst: torch.Tensor
    # old page id -> new page id, for every page of the pool
    remap: torch.Tensor


class KVCompactor:
    def __init__(self, num_pages: int, device: torch.device, min_holes: int = 256):
        self.num_pages = num_pages
        self.device = device
        self.min_holes = min_holes
        self._free: List[int] = []
        self._high_water = 0

    def note_freed(self, pages: List[int]) -> None:
        self._free.extend(pages)

    def note_allocated(self, high_water: int) -> None:
        self._high_water = max(self._high_water, high_water)

    def pop_moves(self) -> Optional[PageMoves]:
        free = set(self._free)
        holes = sorted(p for p in free if p < self._high_water)
        if len(holes) < self.min_holes:
            return None
        tops = [p for p in range(self._high_water - 1, -1, -1) if p not in free][: len(holes)]
        pairs = [(s, d) for s, d in zip(tops, holes) if s > d]
        if not pairs:
            return None
        src = torch.tensor([s for s, _ in pairs], dtype=torch.int64)
        dst = torch.tensor([d for _, d in pairs], dtype=torch.int64)
        remap = torch.arange(self.num_pages, dtype=torch.int32)
        remap[src] = dst.to(torch.int32)
        moved_to = set(dst.tolist())
        self._free = [p for p in self._free if p not in moved_to] + src.tolist()
        self._high_water -= len(pairs)
        to_dev = functools.partial(torch.Tensor.to, device=self.device, non_blocking=True)
        return PageMoves(*map(to_dev, (src, dst, remap)))

    def move_pages(self, kv_pool, moves: PageMoves) -> None:
        for k_buf, v_buf in zip(kv_pool.k_buffers, kv_pool.v_buffers):
            k_buf.index_copy_(0, moves.dst, k_buf.index_select(0, moves.src))
            v_buf.index_copy_(0, moves.dst, v_buf.index_select(0, moves.src))
