"""The elastic pool: one cache tensor, reallocated larger or smaller at run time."""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch

from elastic.config import ElasticConfig


class ElasticKVPool:
    def __init__(self, cfg: ElasticConfig, device: torch.device, num_pages: int):
        assert num_pages % cfg.grow_granularity == 0  # expect: FC109
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"
        self.num_pages = num_pages
        self.kv_cache = self._alloc_cache(num_pages)
        self.refcnt = torch.zeros(num_pages, dtype=torch.int32, device=device)
        # old page id -> current page id, -1 once a shrink dropped the page
        self.remap_dev = torch.arange(num_pages, dtype=torch.int32, device=device)
        self.page_counts: Dict[str, torch.Tensor] = {
            "live": torch.zeros((), dtype=torch.int64, device=device),
            "free": torch.full((), num_pages, dtype=torch.int64, device=device),
        }
        self.free_np = np.arange(num_pages - 1, -1, -1, dtype=np.int64)
        self.num_free = num_pages
        self.resizing = False
        self.request_grow = False
        self.generation = 0
        self.generation_dev = torch.zeros((), dtype=torch.int64, device=device)

    def _alloc_cache(self, n: int) -> torch.Tensor:
        c = self.cfg
        return torch.zeros(c.num_layers, n, 2, c.page_size, c.num_kv_heads, c.head_dim,
                           dtype=torch.bfloat16, device=self.device)

    # ---- allocation -------------------------------------------------------------

    def alloc(self, n: int) -> np.ndarray:
        if n > self.num_free:
            self.request_grow = True
            raise MemoryError(f"need {n} pages, {self.num_free} free")
        pages = self.free_np[self.num_free - n : self.num_free].copy()
        self.num_free -= n
        idx = torch.from_numpy(pages).to(self.device, non_blocking=True)
        self.refcnt.index_fill_(0, idx, 1)
        self.page_counts["live"].add_(n)
        self.page_counts["free"].sub_(n)
        return pages

    def release(self, pages: np.ndarray) -> None:
        idx = torch.from_numpy(pages).to(self.device, non_blocking=True)
        self.refcnt.index_fill_(0, idx, 0)
        self.free_np[self.num_free : self.num_free + len(pages)] = pages
        self.num_free += len(pages)
        self.page_counts["live"].sub_(len(pages))
        self.page_counts["free"].add_(len(pages))

    def live_pages(self) -> torch.Tensor:
        return torch.count_nonzero(self.refcnt)

    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_pages

    # ---- per step ---------------------------------------------------------------

    def lookup_remap(self, page_ids: torch.Tensor) -> torch.Tensor:
        """Check a page table against the current generation's remap table."""
        if self.remap_dev.numel() < self.num_pages:
            extra = torch.arange(self.remap_dev.numel(), self.num_pages, dtype=torch.int32, device=self.device)
            self.remap_dev = torch.cat([self.remap_dev, extra])  # expect: FC107
        mapped = self.remap_dev[page_ids.long()]
        stale = page_ids[mapped < 0]  # expect: FC101
        if stale.numel():
            raise RuntimeError("page table references pages freed by a shrink")
        return mapped

    # ---- resize (rare, between steps) --------------------------------------------

    def grow(self, new_num_pages: int) -> None:
        assert new_num_pages > self.num_pages  # expect: FC109
        self.resizing = True
        torch.cuda.synchronize(self.device)  # ok: FC101
        new_cache = self._alloc_cache(new_num_pages)
        new_cache[:, : self.num_pages].copy_(self.kv_cache)
        self.kv_cache = new_cache
        extra = new_num_pages - self.num_pages
        self.refcnt = torch.cat([self.refcnt, self.refcnt.new_zeros(extra)])
        fresh = np.arange(new_num_pages - 1, self.num_pages - 1, -1, dtype=np.int64)
        self.free_np = np.concatenate([fresh, self.free_np[: self.num_free], np.zeros(self.num_pages - self.num_free, np.int64)])
        self.num_free += extra
        self.page_counts["free"].add_(extra)
        self.num_pages = new_num_pages
        self.generation += 1
        self.generation_dev.fill_(self.generation)
        self.request_grow = False

    def shrink(self, new_num_pages: int) -> np.ndarray:
        """Compact live pages into the first ``new_num_pages``; return old -> new ids."""
        if new_num_pages >= self.num_pages:
            raise ValueError(f"shrink to {new_num_pages} pages from {self.num_pages}")
        self.resizing = True
        live_np = self.refcnt.cpu().numpy() > 0
        order = self._compact_order(live_np)
        if order.size > new_num_pages:
            raise MemoryError(f"{order.size} live pages do not fit in {new_num_pages}")
        mapping = np.full(self.num_pages, -1, dtype=np.int32)
        mapping[order] = np.arange(order.size, dtype=np.int32)
        new_cache = self._alloc_cache(new_num_pages)
        idx = torch.from_numpy(order).to(self.device)
        new_cache[:, : order.size].copy_(self.kv_cache.index_select(1, idx))
        self.kv_cache = new_cache
        self.refcnt = torch.zeros(new_num_pages, dtype=torch.int32, device=self.device)
        self.refcnt[: order.size] = 1
        self.free_np = np.arange(new_num_pages - 1, order.size - 1, -1, dtype=np.int64)
        self.num_free = new_num_pages - order.size
        self.page_counts["free"].fill_(self.num_free)
        self.num_pages = new_num_pages
        self.generation += 1
        self.generation_dev.fill_(self.generation)
        return mapping

    def _compact_order(self, live_np: np.ndarray) -> np.ndarray:
        order = np.flatnonzero(live_np)
        assert order.size <= self.num_pages, "more live pages than pages"  # ok: FC109
        return order

    def finish_resize(self) -> List[int]:
        self.resizing = False
        return [self.generation, self.num_pages]
