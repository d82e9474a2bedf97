"""Paged KV pool (HND pages) with host page tables."""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np
import torch

from yarnserve.settings import ServeSettings


class PagedKVPool:
    def __init__(self, settings: ServeSettings, device: torch.device) -> None:
        s = settings
        self.settings = settings
        self.device = device
        shape = (s.num_pages, 2, s.num_kv_heads, s.page_size, s.head_dim)
        self.layers_kv: List[torch.Tensor] = [torch.zeros(shape, dtype=s.dtype, device=device) for _ in range(s.num_layers)]
        self.page_table_np = np.zeros((s.max_rows, s.max_pages_per_req), dtype=np.int32)
        self.page_table_dev = torch.zeros((s.max_rows, s.max_pages_per_req), dtype=torch.int32, device=device)
        self.seq_lens_np = np.zeros(s.max_rows, dtype=np.int64)
        self.last_page_len_gpu = torch.ones(s.max_rows, dtype=torch.int32, device=device)

    def host_layout(
        self, rows_np: np.ndarray, first_page: Optional[int] = None, last_page: Optional[int] = None
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        ps = self.settings.page_size
        lens = self.seq_lens_np[rows_np]
        total = (lens + ps - 1) // ps
        lo = np.zeros_like(total) if first_page is None else np.minimum(total, first_page)
        hi = total if last_page is None else np.minimum(total, last_page)
        counts = np.maximum(hi - lo, 0).astype(np.int32)
        indptr = np.zeros(len(rows_np) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        parts = [self.page_table_np[r, a:b] for r, a, b in zip(rows_np, lo, hi)]
        indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        last = np.where(hi == total, lens - (total - 1) * ps, ps).astype(np.int32)
        return indptr, indices, last

    def append(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        ps = self.settings.page_size
        page = torch.div(out_loc, ps, rounding_mode="floor")
        slot = out_loc - page * ps
        cache = self.layers_kv[layer_id]
        cache[page, 0, :, slot] = k
        cache[page, 1, :, slot] = v
