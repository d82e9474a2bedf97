"""Attention backend: graph-mode decode wrappers per bucket whose replay metadata is built on the device from the
reservation table, an eager chunk wrapper for the piggybacked prompt chunk, a trtllm-gen overflow wrapper."""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from prio.limits import PoolLimits, WorkspaceTier
from prio.reservation import ReservationTable
from prio_kernels.rows import _build_rows_kernel
from prio_srv.batch import DecodeBatch
from prio_srv.workspace import make_workspace


def make_decode_fn(w: BatchDecodeWithPagedKVCacheWrapper):
    def decode_fn(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return w.run(q, kv)  # ok: FC108

    return decode_fn


def _pad_last_page(buf: torch.Tensor, n: int, bs: int) -> None:
    buf[n:bs] = 1


class ReservationAttnBackend:
    def __init__(self, limits: PoolLimits, table: ReservationTable, device: torch.device):
        self.limits = limits
        self.table = table
        self.device = device
        shape = (limits.num_pages, 2, limits.num_kv_heads, limits.page_size, limits.head_dim)
        self.kv_cache: List[torch.Tensor] = [torch.zeros(shape, dtype=torch.bfloat16, device=device)
                                             for _ in range(limits.num_layers)]
        self.graph_workspace = torch.zeros(WorkspaceTier.LARGE.nbytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.overflow_workspace = make_workspace(limits.overflow_workspace_bytes(), device, zeroed=True)
        self.chunk_workspace = make_workspace(limits.chunk_workspace_bytes(), device)
        self.overflow_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.overflow_workspace, "HND", backend="trtllm-gen")
        self.chunk_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.chunk_workspace, "HND")
        self.page_heat = torch.zeros(limits.num_pages, dtype=torch.int32, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.decode_fns: Dict[int, object] = {}
        self.active_bs: Optional[int] = None
        self._plan_cache: Dict[int, object] = {}
        self._plan_stamp: Dict[int, int] = {}
        self.init_graph_buffers()

    def init_graph_buffers(self) -> None:
        mb = self.limits.max_bucket
        self.graph_kv_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=self.device)
        self.graph_kv_indices = torch.zeros(mb * self.limits.max_pages_per_req, dtype=torch.int32, device=self.device)
        self.graph_last_page_len = torch.empty(mb, dtype=torch.int32, device=self.device)
        self.graph_last_page_len.fill_(1)  # ok: FC104
        self.last_page_len_pinned = torch.ones(mb, dtype=torch.int32, pin_memory=True)

    def bind_bucket(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "HND",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.graph_kv_indices,
            paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
        )
        self.graph_kv_indptr[: bs + 1].zero_()  # ok: FC104
        self.graph_wrappers[bs] = w
        self.decode_fns[bs] = make_decode_fn(w)
        return w

    # ------------------------------------------------------------------ replay metadata from the reservation table
    def stage_bucket(self, bs: int, batch: DecodeBatch) -> None:
        lim = self.limits
        n = batch.num_rows
        w = self.graph_wrappers[bs]
        self.last_page_len_pinned[:n].copy_(torch.from_numpy(batch.last_page_len_np))
        self.last_page_len_pinned[n:bs] = 1
        _build_rows_kernel[(1,)](self.table.page_table_dev, batch.slots, batch.page_counts, self.graph_kv_indptr, self.graph_kv_indices, n, bs, self.table.page_table_dev.stride(0), BLOCK=256)  # ok: FC104
        total_pages = int(self.graph_kv_indptr[n])  # expect: FC101
        if total_pages > self.graph_kv_indices.numel():
            raise RuntimeError(f"bucket {bs}: {total_pages} pages exceed the graph page list")
        stamp = self.table.version
        if self._plan_stamp.get(bs) == stamp:
            w._plan_info = self._plan_cache[bs]  # expect: FC103
        else:
            args = (self.graph_kv_indptr[: bs + 1], self.graph_kv_indices, self.last_page_len_pinned[:bs])
            w.plan(*args, lim.num_qo_heads, lim.num_kv_heads, lim.head_dim, lim.page_size, data_type=torch.bfloat16)  # expect: FC102
            self._plan_cache[bs] = w._plan_info  # expect: FC103
            self._plan_stamp[bs] = stamp
        _pad_last_page(self.graph_last_page_len, n, bs)  # expect: FC104
        self.active_bs = bs

    # ------------------------------------------------------------------ eager plans
    def plan_chunk(self, batch: DecodeBatch) -> None:
        lim = self.limits
        nd = batch.num_decode_rows
        kv_indptr = batch.kv_indptr_np[nd:] - batch.kv_indptr_np[nd]
        self.chunk_wrapper.plan(  # ok: FC102
            torch.from_numpy(batch.chunk_qo_indptr_np),
            torch.from_numpy(np.ascontiguousarray(kv_indptr)),
            batch.kv_indices[batch.kv_indptr_np[nd] :],
            torch.from_numpy(batch.last_page_len_np[nd:]),
            lim.num_qo_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
            causal=True,
        )

    def plan_overflow(self, batch: DecodeBatch) -> None:
        lim = self.limits
        nd = batch.num_decode_rows
        self.overflow_wrapper.plan(
            torch.from_numpy(batch.kv_indptr_np[: nd + 1]),
            batch.kv_indices,
            torch.from_numpy(batch.last_page_len_np[:nd]),
            lim.num_qo_heads,
            lim.num_kv_heads,
            lim.head_dim,
            lim.page_size,
            data_type=torch.bfloat16,
        )
        self.active_bs = None

    # ------------------------------------------------------------------ attention
    def _write_kv(self, layer_id: int, batch: DecodeBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        page, slot = batch.out_loc // self.limits.page_size, batch.out_loc % self.limits.page_size
        self.kv_cache[layer_id][page, 0, :, slot] = k
        self.kv_cache[layer_id][page, 1, :, slot] = v
        self.page_heat.index_add_(0, page, torch.ones_like(page, dtype=torch.int32))

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                       batch: DecodeBatch) -> torch.Tensor:
        self._write_kv(layer_id, batch, k, v)
        kv = self.kv_cache[layer_id]
        nd = batch.num_decode_rows
        o = self.decode_fns[self.active_bs](q[:nd], kv)
        if batch.chunk_rows:
            o_chunk = self.chunk_wrapper.run(q[nd:], kv)  # expect: FC108
            o = torch.cat([o, o_chunk], dim=0)
        return o

    def forward_decode_eager(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                             batch: DecodeBatch) -> torch.Tensor:
        self._write_kv(layer_id, batch, k, v)
        kv = self.kv_cache[layer_id]
        nd = batch.num_decode_rows
        o = self.overflow_wrapper.run(q[:nd], kv)
        if batch.chunk_rows:
            o = torch.cat([o, self.chunk_wrapper.run(q[nd:], kv)], dim=0)
        return o
