"""Decode attention with one set of CUDA-graph wrappers per (band, bucket).

All bands share one set of graph-bound buffers (graphs of different bands never
run at the same time); each band plans with its own softmax scale (YaRN's
attention temperature).  The yarn band splits long contexts into a near pass
and a far pass merged by LSE.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, merge_state

from yarnserve.bands import BandTable, RopeBand, Scaling
from yarnserve.kv_pool import PagedKVPool
from yarnserve.settings import ServeSettings
from yarn_engine.batch import DecodeBatch


class BandDecodeAttention:
    def __init__(self, settings: ServeSettings, table: BandTable, pool: PagedKVPool, device: torch.device) -> None:
        self.settings = settings
        self.table = table
        self.pool = pool
        self.device = device
        s = settings
        self.decode_workspace = torch.zeros(s.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.long_ws = torch.empty(s.long_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "HND", use_tensor_cores=True)
        self.far_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "HND", use_tensor_cores=True)
        self.long_decode = BatchDecodeWithPagedKVCacheWrapper(self.long_ws, "HND", backend="trtllm-gen")

        max_bs = max(s.graph_buckets)
        max_idx = max_bs * s.max_pages_per_req
        self.graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.graph_kv_indices = torch.zeros(max_idx, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_idx, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.graph_wrappers: Dict[Tuple[int, int], BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_key: Optional[Tuple[int, int]] = None
        self.far_pages = s.far_split // s.page_size

    def _plan_args(self, band: RopeBand) -> dict:
        s = self.settings
        return dict(
            num_qo_heads=s.num_q_heads,
            num_kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            page_size=s.page_size,
            sm_scale=band.sm_scale(s.head_dim),
            q_data_type=s.dtype,
        )

    def init_graph_buffers(self) -> None:
        self.graph_kv_indices.zero_()  # ok: FC104
        for band in self.table.bands:
            for bs in self.settings.graph_buckets:
                self.graph_wrappers[(band.index, bs)] = BatchDecodeWithPagedKVCacheWrapper(
                    self.decode_workspace,
                    "HND",
                    use_cuda_graph=True,
                    use_tensor_cores=True,
                    paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
                    paged_kv_indices_buffer=self.graph_kv_indices,
                    paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
                )

    def prepare_band(self, band: RopeBand, bs: int, batch: DecodeBatch) -> None:
        n = batch.size
        w = self.graph_wrappers[(band.index, bs)]
        if w._paged_kv_indptr_buf.numel() < bs + 1:  # expect: FC103
            raise RuntimeError(f"graph wrapper for band {band.name} was built for a smaller bucket")
        first = self.far_pages if batch.split_far else None
        indptr_np, indices_np, last_np = self.pool.host_layout(batch.rows_np, first_page=first)
        nnz = int(indptr_np[-1])
        self.kv_indptr_cpu[: n + 1].copy_(torch.from_numpy(indptr_np))
        self.kv_indptr_cpu[n + 1 : bs + 1] = nnz
        self.kv_indices_cpu[:nnz].copy_(torch.from_numpy(indices_np))
        self.last_page_len_cpu[:n].copy_(torch.from_numpy(last_np))
        self.seq_lens_cpu[:n].copy_(torch.from_numpy(batch.seq_lens_np))
        longest = int(self.seq_lens_cpu[:n].max())  # ok: FC101
        self.graph_kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.graph_kv_indices[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)
        self.graph_last_page_len[:n].copy_(self.last_page_len_cpu[:n], non_blocking=True)
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices_cpu[:nnz],
            self.last_page_len_cpu[:bs],
            **self._plan_args(band),
        )
        if band.scaling is Scaling.YARN and longest > self.settings.far_split:
            self._plan_far(band, batch)
        # padded rows of the bucket read one token of page 0
        self.graph_last_page_len[n:bs].fill_(1)  # expect: FC104
        self.graph_key = (band.index, bs)

    def _plan_far(self, band: RopeBand, batch: DecodeBatch) -> None:
        indptr_np, indices_np, _ = self.pool.host_layout(batch.rows_np, last_page=self.far_pages)
        self.far_wrapper.plan(
            torch.from_numpy(indptr_np),
            torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            torch.full((batch.size,), self.settings.page_size, dtype=torch.int32),
            **self._plan_args(band),
        )

    def plan_eager(self, band: RopeBand, batch: DecodeBatch) -> None:
        self.graph_key = None
        first = self.far_pages if batch.split_far else None
        indptr_np, indices_np, last_np = self.pool.host_layout(batch.rows_np, first_page=first)
        kv_indptr_cpu = torch.from_numpy(indptr_np)
        last_page_len_cpu = torch.from_numpy(last_np)
        self.eager_decode.plan(  # ok: FC102
            kv_indptr_cpu,
            torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            last_page_len_cpu,
            **self._plan_args(band),
        )
        if batch.split_far:
            self._plan_far(band, batch)

    def plan_long(self, batch: DecodeBatch) -> None:
        indptr_np, indices_np, last_np = self.pool.host_layout(batch.rows_np)
        self.long_decode.plan(
            torch.from_numpy(indptr_np),
            torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            torch.from_numpy(last_np),
            **self._plan_args(self.table[len(self.table) - 1]),
        )

    def forward(self, q: torch.Tensor, layer_id: int, batch: DecodeBatch) -> torch.Tensor:
        kv = self.pool.layers_kv[layer_id]
        w = self.eager_decode if self.graph_key is None else self.graph_wrappers[self.graph_key]
        if not batch.split_far:
            return w.run(q, kv)  # ok: FC108
        near, near_lse = w.run(q, kv, return_lse=True)
        far, far_lse = self.far_wrapper.run(q, kv, return_lse=True)  # expect: FC108
        out, _ = merge_state(near, near_lse, far, far_lse)
        return out

    def forward_long(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.long_decode.run(q, self.pool.layers_kv[layer_id])

    def host_rows(self, batch: DecodeBatch) -> np.ndarray:
        return batch.rows_np
