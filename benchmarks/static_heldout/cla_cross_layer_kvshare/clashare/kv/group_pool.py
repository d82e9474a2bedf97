"""One paged KV cache per CLA group.

The page tables live on the host (numpy): the scheduler owns them, and the
attention backend derives indptr / indices / last-page lengths from them every
step.  Local (sliding-window) groups drop the pages that left the window.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch

from clashare.config import CLAConfig
from clashare.groups import LayerGroupMap


class GroupKVPool:
    def __init__(self, cfg: CLAConfig, group_map: LayerGroupMap, device: torch.device) -> None:
        self.cfg = cfg
        self.group_map = group_map
        self.device = device
        G = group_map.num_groups
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.caches = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(G)]
        self.page_table_np = [np.zeros((cfg.max_batch, cfg.max_pages_per_req), dtype=np.int32) for _ in range(G)]
        self.first_page_np = [np.zeros(cfg.max_batch, dtype=np.int32) for _ in range(G)]
        self.page_table_dev = torch.zeros((G, cfg.max_batch, cfg.max_pages_per_req), dtype=torch.int32, device=device)
        self.num_pages_dev = torch.zeros((G, cfg.max_batch), dtype=torch.int32, device=device)
        self.free: List[List[int]] = [list(range(cfg.num_pages - 1, 0, -1)) for _ in range(G)]

    def group_cache(self, group: int) -> torch.Tensor:
        return self.caches[group]

    def append_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        assert self.group_map.is_producer(layer_id), "only a group's first layer appends KV"  # expect: FC109
        cache = self.caches[self.group_map.group_of(layer_id)]
        page = torch.div(slots, self.cfg.page_size, rounding_mode="floor")
        off = slots - page * self.cfg.page_size
        cache[page, 0, off] = k
        cache[page, 1, off] = v

    def host_page_layout(
        self, group: int, rows: np.ndarray, seq_lens: np.ndarray
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """indptr / indices / last_page_len of ``rows`` in ``group``, all numpy."""
        ps = self.cfg.page_size
        total_pages = (seq_lens + ps - 1) // ps
        first = self.first_page_np[group][rows]
        if self.group_map.is_local(group):
            window_pages = self.cfg.local_window // ps + 1
            first = np.maximum(first, total_pages - window_pages)
        counts = (total_pages - first).astype(np.int32)
        indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        table = self.page_table_np[group]
        indices = np.concatenate(
            [table[r, f:t] for r, f, t in zip(rows, first, total_pages)] or [np.zeros(0, np.int32)]
        )
        last = (seq_lens - (total_pages - 1) * ps).astype(np.int32)
        return indptr, indices, last

    def slide_window(self, group: int, rows: np.ndarray, seq_lens: np.ndarray) -> None:
        """Return pages that left a local group's window to the free list."""
        ps = self.cfg.page_size
        keep_from = np.maximum((seq_lens + ps - 1) // ps - (self.cfg.local_window // ps + 1), 0)
        for r, start in zip(rows.tolist(), keep_from.tolist()):
            old = int(self.first_page_np[group][r])
            self.free[group].extend(self.page_table_np[group][r, old:start].tolist())
            self.first_page_np[group][r] = start

    def free_rows(self, group: int, rows: List[int]) -> None:
        for r in rows:
            self.free[group].extend(self.page_table_np[group][r].tolist())
            self.page_table_np[group][r] = 0
            self.first_page_np[group][r] = 0
