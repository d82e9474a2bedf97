"""Paged KV cache storage and the page-table kernels (torch reference implementations).

This folder is a namespace package shared with the offline tools; it has no
``__init__.py`` on purpose.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from descserve.config import KV_POOL_ALIGN


def _align(n: int, multiple: int) -> int:
    assert multiple > 0 and multiple & (multiple - 1) == 0, multiple  # ok: FC109
    return (n + multiple - 1) & ~(multiple - 1)


def build_kv_indices(
    req_to_page: torch.Tensor,
    req_pool_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    out: torch.Tensor,
    total: int,
) -> torch.Tensor:
    """``out[kv_indptr[i] + j] = req_to_page[req_pool_indices[i], j]`` for the ``total`` pages.

    ``kv_indptr`` is already on the device; ``total`` is the host value of its last entry,
    so no length ever comes back from the GPU.
    """
    bs = req_pool_indices.shape[0]
    pages = kv_indptr[1 : bs + 1] - kv_indptr[:bs]
    rows = torch.arange(bs, device=out.device)
    row_of = torch.repeat_interleave(rows, pages, output_size=total)  # ok: FC101
    col_of = torch.arange(total, device=out.device, dtype=torch.int32) - kv_indptr[row_of]
    out[:total] = req_to_page[req_pool_indices[row_of], col_of.long()]
    return out[:total]


class PagedKVPool:
    """One ``[num_pages, 2, page_size, kv_heads, head_dim]`` tensor per layer."""

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.page_size = page_size
        self.num_pages = _align(num_pages, KV_POOL_ALIGN)
        self.device = device
        self.kv: List[torch.Tensor] = [
            torch.zeros(self.num_pages, 2, page_size, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]

    def get_kv_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv[layer_id]

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        page = loc // self.page_size
        slot = loc % self.page_size
        cache = self.kv[layer_id]
        cache[page, 0, slot] = k.to(cache.dtype)
        cache[page, 1, slot] = v.to(cache.dtype)

    def move_pages(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        for cache in self.kv:
            cache[dst] = cache[src]


class KVCompactor:
    """Packs live pages to the front of the pool between steps.

    Only the request-to-page table is remapped: every backend rebuilds its page indices from
    that table in its next metadata pass, before it plans.
    """

    __slots__ = ("pool", "req_to_page", "_pending")

    def __init__(self, pool: PagedKVPool, req_to_page: torch.Tensor) -> None:
        self.pool = pool
        self.req_to_page = req_to_page
        self._pending: Optional[np.ndarray] = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def schedule(self, old_to_new: np.ndarray) -> None:
        self._pending = old_to_new

    def apply_remap(self) -> None:
        mapping_host = self._pending
        if mapping_host is None:
            return
        moved = np.nonzero(mapping_host != np.arange(mapping_host.shape[0]))[0]
        src = torch.from_numpy(moved).to(self.pool.device, non_blocking=True)
        dst = torch.from_numpy(mapping_host[moved]).to(self.pool.device, non_blocking=True)
        self.pool.move_pages(src, dst)
        mapping = torch.from_numpy(mapping_host.astype(np.int32)).to(self.pool.device, non_blocking=True)
        self.req_to_page.copy_(mapping[self.req_to_page.long()])
        self._pending = None
