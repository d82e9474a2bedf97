"""Mixins the builders are composed from. Each takes its own keywords and passes the rest up the MRO."""
from __future__ import annotations

import collections
from typing import ClassVar, Dict, Tuple

import numba
import numpy as np
import torch
import triton
import triton.language as tl
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from mcmb.batches import BatchBase
from mcmb.config import PLAN_INFO_ATTR


@numba.njit(cache=True)
def _pages_per_seq(seq_lens: np.ndarray, page_size: int) -> np.ndarray:
    assert page_size > 0  # ok: FC109
    return (seq_lens + page_size - 1) // page_size


@triton.jit
def block_table_to_indices_kernel(block_table_ptr, bt_stride, kv_indptr_ptr, kv_indices_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    start = tl.load(kv_indptr_ptr + row)
    n = tl.load(kv_indptr_ptr + row + 1) - start
    for off in range(0, n, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        pages = tl.load(block_table_ptr + row * bt_stride + cols, mask=cols < n)
        tl.store(kv_indices_ptr + start + cols, pages, mask=cols < n)


class PagedIndexMixin:
    """Host-side paged-KV index arrays from the scheduler's numpy block table."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.page_size = self.cfg.page_size

    def paged_indices(self, batch: BatchBase) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        assert batch.block_table_np.shape[0] == batch.num_seqs, "block table rows != sequences"  # expect: FC109
        lens = batch.seq_lens_cpu.numpy()
        pages = _pages_per_seq(lens, self.page_size)
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        rows = [i for i in range(len(lens)) if pages[i] > 0]  # ok: FC101
        indices = np.zeros(int(indptr[-1]), dtype=np.int32)  # ok: FC101
        for i in rows:
            indices[indptr[i] : indptr[i + 1]] = batch.block_table_np[i, : pages[i]]
        last = (lens - (pages - 1) * self.page_size).astype(np.int32)
        return indptr, indices, last


class WindowClipMixin:
    """Keeps only the pages a sliding window can still see."""

    def paged_indices(self, batch: BatchBase) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        indptr, indices, last = super().paged_indices(batch)
        if not torch.any(batch.seq_lens > self.cfg.sliding_window):  # expect: FC101
            return indptr, indices, last
        keep = self.cfg.sliding_window // self.page_size + 1
        pages = np.minimum(np.diff(indptr), keep)
        starts = indptr[1:] - pages
        clipped = np.concatenate([indices[s:e] for s, e in zip(starts, indptr[1:])])  # ok: FC101
        return np.concatenate([[0], np.cumsum(pages)]).astype(np.int32), clipped, last


class GraphBufferMixin:
    """Allocates the device buffers that subclasses bind to graph-mode wrappers, with pinned staging copies."""

    def __init__(self, *, max_graph_bs: int, max_graph_pages: int, **kw):
        assert max_graph_pages >= max_graph_bs, "each graph row needs at least one page"  # expect: FC109
        super().__init__(**kw)
        dev = self.device
        self.max_graph_bs = max_graph_bs
        self.graph_bufs: Dict[str, torch.Tensor] = {
            "kv_indptr": torch.zeros(max_graph_bs + 1, dtype=torch.int32, device=dev),
            "kv_indices": torch.zeros(max_graph_pages, dtype=torch.int32, device=dev),
            "kv_last_page_len": torch.empty(max_graph_bs, dtype=torch.int32, device=dev),
        }
        self.graph_bufs["kv_last_page_len"].fill_(1)  # ok: FC104
        self.graph_staging = {k: torch.zeros(v.shape, dtype=v.dtype, pin_memory=True) for k, v in self.graph_bufs.items()}
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def reset_graph_bufs(self) -> None:
        """After an aborted step: no stale page ids for the next replay to read."""
        for buf in self.graph_bufs.values():
            buf.zero_()  # expect: FC104

    def check_bindings(self) -> Dict[int, bool]:
        bound = self.graph_bufs["kv_last_page_len"].data_ptr()
        return {bs: w._paged_kv_last_page_len_buf.data_ptr() == bound for bs, w in self.graph_wrappers.items()}  # expect: FC103


class PlanCacheMixin:
    """Skips plan() when a wrapper is asked for the plan it already holds."""

    plan_cache_size: ClassVar[int] = 64

    def __init__(self, **kw):
        super().__init__(**kw)
        self._plan_info: "collections.OrderedDict[int, Tuple]" = collections.OrderedDict()  # ok: FC103
        self.plan_hits = 0

    def plan_key(self, kind: str, batch: BatchBase) -> Tuple:
        return (kind, batch.num_seqs, tuple(batch.seq_lens.tolist()))  # expect: FC101

    def needs_plan(self, wrapper: object, key: Tuple) -> bool:
        if self._plan_info.get(id(wrapper)) == key:
            self.plan_hits += 1
            return False
        self._plan_info[id(wrapper)] = key
        self._evict()
        return True

    def _evict(self) -> None:
        while len(self._plan_info) > self.plan_cache_size:
            self._plan_info.popitem(last=False)
        assert len(self._plan_info) <= self.plan_cache_size  # ok: FC109

    def plan_debug(self, wrapper: BatchDecodeWithPagedKVCacheWrapper) -> object:
        return getattr(wrapper, PLAN_INFO_ATTR, None)  # expect: FC103
