"""Paged KV cache: per-layer page arrays, the request-to-page table and the free-page masks."""

from __future__ import annotations

import logging
import weakref

import numpy as np
import torch
import triton
import triton.language as tl

from wrl.buffers import GraphBufferPool
from wrl.config import EngineConfig

logger = logging.getLogger(__name__)


class OutOfPagesError(RuntimeError):
    pass


@triton.jit
def _fill_kv_indices_kernel(
    req_to_page_ptr,
    req_pool_indices_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    stride_req,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    req = tl.load(req_pool_indices_ptr + pid)
    start = tl.load(kv_indptr_ptr + pid)
    end = tl.load(kv_indptr_ptr + pid + 1)
    num_pages = end - start
    num_loops = tl.cdiv(num_pages, BLOCK)
    for i in range(num_loops):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        mask = offs < num_pages
        page = tl.load(req_to_page_ptr + req * stride_req + offs, mask=mask)
        tl.store(kv_indices_ptr + start + offs, page, mask=mask)


def fill_kv_indices(req_to_page, req_pool_indices, kv_indptr, kv_indices, bs: int) -> None:
    """Flatten the page rows of ``bs`` requests into ``kv_indices`` at the offsets ``kv_indptr`` gives
    (both on the device)."""
    _fill_kv_indices_kernel[(bs,)](
        req_to_page, req_pool_indices, kv_indptr, kv_indices, req_to_page.stride(0), BLOCK=128
    )


class PagedKVPool:
    def __init__(self, cfg: EngineConfig, device: torch.device, graph_buffers: GraphBufferPool):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.num_pages = cfg.num_pages
        dtype = getattr(torch, cfg.dtype)
        self.kv_data = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.req_to_page = torch.zeros(
            cfg.max_running_requests, cfg.max_pages_per_req, dtype=torch.int32, device=device
        )
        # authoritative free mask on the host; the device copy feeds the eviction kernel and the
        # bulk prefill allocation
        self.free_mask_np = np.ones(cfg.num_pages, dtype=np.bool_)
        self.free_mask_np[0] = False  # page 0 is the dummy page padded graph rows point at
        self.free_mask = torch.from_numpy(self.free_mask_np).to(device)
        self._host_mask_stale = False
        self._graph_bufs_ref = weakref.ref(graph_buffers)
        self.compact_stream = torch.cuda.Stream(device=device)

    def kv_buffer(self, layer_id: int) -> torch.Tensor:
        return self.kv_data[layer_id]

    def store(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        pages = loc // self.page_size
        slots = loc % self.page_size
        cache = self.kv_data[layer_id]
        cache[pages, 0, slots] = k
        cache[pages, 1, slots] = v

    def alloc_decode_pages(self, num_pages: int) -> np.ndarray:
        """A few pages for requests that crossed a page boundary this step."""
        free = np.flatnonzero(self.free_mask_np)[:num_pages]  # ok: FC101
        if free.shape[0] < num_pages:
            raise OutOfPagesError(f"need {num_pages} pages, {free.shape[0]} free")
        self.free_mask_np[free] = False
        self.free_mask[torch.from_numpy(free).to(self.device, non_blocking=True)] = False
        return free

    def alloc_prefill_pages(self, num_pages: int) -> torch.Tensor:
        """Many pages at once for a prefill; picked on the device where the evictor keeps the mask."""
        free = torch.nonzero(self.free_mask).squeeze(1)  # expect: FC101
        if free.shape[0] < num_pages:
            raise OutOfPagesError(f"need {num_pages} pages, {free.shape[0]} free")
        pages = free[:num_pages]
        self.free_mask[pages] = False
        self._host_mask_stale = True
        return pages

    def assign(self, req_pool_indices_np: np.ndarray, first_page_np: np.ndarray, pages: torch.Tensor) -> None:
        rows = torch.from_numpy(req_pool_indices_np).to(self.device, non_blocking=True).long()
        cols = torch.from_numpy(first_page_np).to(self.device, non_blocking=True).long()
        self.req_to_page[rows, cols] = pages.int()

    def fragmentation(self) -> float:
        used = np.flatnonzero(~self.free_mask_np)
        if used.shape[0] == 0:
            return 0.0
        return 1.0 - used.shape[0] / float(used[-1] + 1)

    def compact(self, moves_np: np.ndarray) -> None:
        """Move pages towards the front of the pool; ``moves_np`` is an (n, 2) array of (src, dst)."""
        with torch.cuda.stream(self.compact_stream):
            src = torch.from_numpy(moves_np[:, 0]).to(self.device, non_blocking=True)
            dst = torch.from_numpy(moves_np[:, 1]).to(self.device, non_blocking=True)
            for cache in self.kv_data:
                cache[dst] = cache[src]
            remap = torch.arange(self.num_pages, dtype=torch.int32, device=self.device)
            remap[src] = dst.int()
            self.req_to_page.copy_(remap[self.req_to_page.long()])
            bufs = self._graph_bufs_ref()
            if bufs is not None:
                # keep the captured graphs' page table in step with the moved pages
                n = int(bufs.kv_indptr_cpu[bufs.last_bs])  # ok: FC101
                bufs.kv_indices[:n] = remap[bufs.kv_indices[:n].long()]  # expect: FC104
        self.free_mask_np[moves_np[:, 0]] = True
        self.free_mask_np[moves_np[:, 1]] = False
        self.free_mask.copy_(torch.from_numpy(self.free_mask_np), non_blocking=True)
