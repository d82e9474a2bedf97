"""Requantization of FP8 pages whose scale is older than their layer's.

Stale pages are requantized out of place, all layers at once, into fresh pages, so a decode graph still in flight
keeps reading the old copies; the decode page list is then pointed at the new pages."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Generator, List, Optional, Tuple

import torch
import triton
import triton.language as tl

from .page_pool import FP8_MAX, QuantPagePool

if TYPE_CHECKING:
    from .decode import QuantDecodeBackend

logger = logging.getLogger(__name__)


@triton.jit
def _requant_kernel(pages_ptr, page_scale_ptr, layer_scale_ptr, src_ptr, dst_ptr, num_pages,
                    PAGE_ELEMS: tl.constexpr, BLOCK: tl.constexpr):
    i, lp = tl.program_id(0), tl.program_id(1)  # lp = layer * 2 + (0: K, 1: V)
    layer, plane = lp // 2, lp % 2
    src = (layer * num_pages + tl.load(src_ptr + i)) * 2 + plane
    dst = (layer * num_pages + tl.load(dst_ptr + i)) * 2 + plane
    new_scale = tl.load(layer_scale_ptr + lp)
    ratio = tl.load(page_scale_ptr + src) / new_scale
    for start in range(0, PAGE_ELEMS, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(pages_ptr + src * PAGE_ELEMS + offs).to(tl.float32)
        tl.store(pages_ptr + dst * PAGE_ELEMS + offs, (x * ratio).to(tl.float8e4nv))
    tl.store(page_scale_ptr + dst, new_scale)


@triton.jit
def _remap_kernel(indices_ptr, remap_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    idx = tl.load(indices_ptr + offs, mask=m, other=0)
    tl.store(indices_ptr + offs, tl.load(remap_ptr + idx, mask=m), mask=m)


class RequantScheduler:
    def __init__(self, pool: QuantPagePool, backend: "QuantDecodeBackend") -> None:
        self.pool, self.backend = pool, backend
        num_pages, dev = pool.page_scale.shape[1], pool.k_scale.device
        self._stale = torch.zeros(num_pages, dtype=torch.bool, device=dev)
        self._remap = torch.arange(num_pages, dtype=torch.int32, device=dev)
        self._moved = False
        self._collector = self._collect()
        next(self._collector)

    def _collect(self) -> Generator[None, Tuple[int, torch.Tensor], None]:
        """Coroutine fed (layer, amax of the pages written this step): raises the scale, marks stale pages."""
        pool = self.pool
        while True:
            layer, amax = yield
            pool.k_scale[layer] = torch.maximum(pool.k_scale[layer], amax[:, 0].max() / FP8_MAX)
            pool.v_scale[layer] = torch.maximum(pool.v_scale[layer], amax[:, 1].max() / FP8_MAX)
            cur = torch.stack([pool.k_scale[layer], pool.v_scale[layer]])
            self._stale |= (pool.page_scale[layer] != cur).any(-1)

    def observe(self, amax_per_layer: List[torch.Tensor]) -> None:
        for layer, amax in enumerate(amax_per_layer):
            self._collector.send((layer, amax))

    def flush(self) -> None:
        """Requantize every stale page into a fresh one and record where it moved."""
        pool = self.pool
        stale = torch.nonzero(self._stale).flatten()  # expect: FC101
        n = stale.numel()
        if n == 0:
            return
        if n > pool.free_pages:
            raise MemoryError(f"no free pages to requantize {stale}")  # ok: FC101
        logger.debug("requantizing %d pages: %s", n, stale)  # ok: FC101
        dst = torch.tensor(pool.alloc(n), dtype=torch.int64).to(stale.device, non_blocking=True)
        scales = torch.stack([pool.k_scale, pool.v_scale], dim=-1)  # [layers, 2]
        _requant_kernel[(n, 2 * scales.shape[0])](pool.kv_pages, pool.page_scale, scales, stale, dst,
                                                 pool.page_scale.shape[1],
                                                 PAGE_ELEMS=pool.kv_pages[0, 0, 0].numel(), BLOCK=1024)
        self._remap[stale] = dst.to(torch.int32)
        self._stale.zero_()
        self._moved = True

    def relocate(self, nnz: Optional[int] = None) -> None:
        """Point the decode page list at the requantized copies."""
        if not self._moved:
            return
        n = self.backend.nnz if nnz is None else nnz
        _remap_kernel[(triton.cdiv(n, 1024),)](self.backend.kv_indices, self._remap, n, BLOCK=1024)  # expect: FC104
        self._moved = False
