"""Paged KV cache: one tensor per engine (layers first), a host free stack and device reference counts."""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import torch

from memprof.limits import EngineLimits

logger = logging.getLogger(__name__)


class PagedKVPool:
    """KV pages in HND layout ``[layer, page, 2, kv_head, page_size, head_dim]``.

    Page 0 is never handed out: padded rows of a captured batch point at it. Reference counts live on the device
    because the sampler frees pages of finished sequences without a round trip; the free stack lives on the host.
    """

    def __init__(
        self,
        limits: EngineLimits,
        num_pages: int,
        device: torch.device | str,
        dtype: torch.dtype = torch.float16,
        max_pages_cap: Optional[int] = None,
    ) -> None:
        if num_pages < 2:
            raise ValueError(f"a KV pool needs at least two pages (one is the null page), got {num_pages}")
        self.limits = limits
        self.device = torch.device(device)
        self.dtype = dtype
        self.num_pages = num_pages
        self.max_pages_cap = max(max_pages_cap or num_pages, num_pages)
        self.kv_cache = self._alloc_pages(num_pages)
        self.free_np = np.zeros(self.max_pages_cap, dtype=np.int32)
        self.free_np[: num_pages - 1] = np.arange(num_pages - 1, 0, -1, dtype=np.int32)
        self._free_top = num_pages - 1
        # sized for the cap once, so growth never rebinds it
        self.page_refcnt = torch.zeros(self.max_pages_cap, dtype=torch.int32, device=self.device)

    def _alloc_pages(self, n: int) -> torch.Tensor:
        lim = self.limits
        return torch.zeros(
            lim.num_layers, n, 2, lim.num_kv_heads, lim.page_size, lim.head_dim, dtype=self.dtype, device=self.device
        )

    # ------------------------------------------------------------------ views

    def layer(self, layer_id: int) -> torch.Tensor:
        return self.kv_cache[layer_id]

    @property
    def num_free_host(self) -> int:
        return self._free_top

    @property
    def pages_in_use(self) -> torch.Tensor:
        """Pages that at least one live sequence references (a device count)."""
        return self.page_refcnt[: self.num_pages].gt(0).sum()

    @property
    def nbytes(self) -> int:
        return self.kv_cache.numel() * self.kv_cache.element_size()

    # ------------------------------------------------------------- free stack

    def allocate(self, n: int) -> np.ndarray:
        assert n <= self._free_top, "KV pool exhausted"  # expect: FC109
        self._free_top -= n
        pages = self.free_np[self._free_top : self._free_top + n].copy()
        self._check_invariants()
        return pages

    def release(self, pages: np.ndarray) -> None:
        n = int(pages.size)
        self.free_np[self._free_top : self._free_top + n] = pages
        self._free_top += n
        self._check_invariants()

    def retain_dev(self, pages_dev: torch.Tensor) -> None:
        self.page_refcnt.index_add_(0, pages_dev.long(), torch.ones_like(pages_dev, dtype=torch.int32))

    def drop_dev(self, pages_dev: torch.Tensor) -> None:
        self.page_refcnt.index_add_(0, pages_dev.long(), torch.full_like(pages_dev, -1, dtype=torch.int32))

    def _check_invariants(self) -> None:
        assert 0 <= self._free_top <= self.num_pages - 1  # ok: FC109

    # ------------------------------------------------------------------ growth

    def grow(self, extra_pages: int) -> int:
        """Add pages when a later memory check finds headroom the start-up profile did not."""
        extra_pages = min(extra_pages, self.max_pages_cap - self.num_pages)
        if extra_pages <= 0:
            return 0
        old = self.num_pages
        self.kv_cache = torch.cat([self.kv_cache, self._alloc_pages(extra_pages)], dim=1)  # expect: FC107
        new_ids = np.arange(old + extra_pages - 1, old - 1, -1, dtype=np.int32)
        self.free_np[self._free_top : self._free_top + extra_pages] = new_ids
        self._free_top += extra_pages
        self.num_pages = old + extra_pages
        logger.info("KV pool grew by %d pages to %d", extra_pages, self.num_pages)
        return extra_pages
