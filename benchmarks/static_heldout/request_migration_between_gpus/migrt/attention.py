"""Decode attention of one GPU; while requests migrate in, their pages still on the source are read
over the peer link by a second wrapper and merged by LSE."""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper, merge_state
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from gpumig.limits import DECODE_WS_BYTES, MigrationLimits
from gpumig.page_table import DevicePageTable, KVPool
from migrt.batch import StepBatch


class DeviceAttention:
    def __init__(self, limits: MigrationLimits, pool: KVPool, table: DevicePageTable, device: torch.device) -> None:
        self.limits = limits
        self.pool = pool
        self.table = table
        self.device = device
        self.layout = table._kv_layout  # ok: FC103
        layout = self.layout
        self.page_size = limits.page_size
        self.sm_scale = limits.head_dim**-0.5
        gb = limits.max_graph_bs
        self.graph_indptr = torch.zeros(gb + 1, dtype=torch.int32, device=device)
        self.graph_indices = torch.zeros(gb * limits.max_pages_per_req, dtype=torch.int32, device=device)
        self.graph_last_page = torch.ones(gb, dtype=torch.int32, device=device)
        self.indptr_pinned = torch.zeros(gb + 1, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.ones(gb, dtype=torch.int32, pin_memory=True)
        self.graph_ws = torch.empty(limits.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

        self.eager_ws = torch.empty(DECODE_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, layout, use_tensor_cores=True)

        self.peer_ws = torch.empty(limits.peer_workspace_bytes(), dtype=torch.uint8, device=device)
        self.peer_decode = BatchDecodeWithPagedKVCacheWrapper(self.peer_ws, layout, use_tensor_cores=True)
        self.peer_kv: Optional[List[torch.Tensor]] = None

        self.prefill_ws = torch.zeros(limits.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.recompute = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_ws, layout)

        self.trt_ws = torch.empty(limits.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.block_tables = torch.zeros(
            limits.max_batch, limits.max_pages_per_req, dtype=torch.int32, device=device
        )
        self.seq_lens_dev = torch.zeros(limits.max_batch, dtype=torch.int32, device=device)
        self.max_seq_len = 0
        self.init_bucket_buffers()

    def _heads(self):
        lim = self.limits
        return lim.num_qo_heads, lim.num_kv_heads, lim.head_dim, lim.page_size

    def init_bucket_buffers(self) -> None:
        self.graph_indices.zero_()  # ok: FC104
        self.graph_last_page.fill_(1)

    def bind_bucket(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws,
            self.layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.graph_indptr[: bs + 1],
            paged_kv_indices_buffer=self.graph_indices,
            paged_kv_last_page_len_buffer=self.graph_last_page[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def prepare_replay(self, bs: int, batch: StepBatch) -> None:
        n, nnz = batch.size, batch.num_pages
        self.graph_indices[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        ip = self.indptr_pinned.numpy()
        ip[: n + 1] = batch.kv_indptr_host.numpy()
        ip[n + 1 : bs + 1] = nnz
        last = self.last_pinned.numpy()
        last[:n] = batch.kv_last_page_host.numpy()
        last[n:bs] = 1
        hq, hkv, d, ps = self._heads()
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.indptr_pinned[: bs + 1],
            self.graph_indices[:nnz],
            self.last_pinned[:bs],
            hq,
            hkv,
            d,
            ps,
            data_type=torch.bfloat16,
        )

    def prepare_eager(self, batch: StepBatch, rows: torch.Tensor) -> None:
        n = batch.size
        self.max_seq_len = int(batch.seq_lens_cpu.max())
        if self.limits.use_trtllm:
            self.block_tables[:n].copy_(self.table.table_dev.index_select(0, rows))
            self.seq_lens_dev[:n].copy_(batch.seq_lens_cpu, non_blocking=True)
            return
        hq, hkv, d, ps = self._heads()
        self.eager_decode.plan(
            batch.kv_indptr_host, batch.kv_indices, batch.kv_last_page_host, hq, hkv, d, ps, data_type=torch.bfloat16
        )

    def plan_recompute(self, qo_indptr: np.ndarray) -> None:
        hq, hkv, d, _ = self._heads()
        host = torch.from_numpy(qo_indptr)
        self.recompute.plan(host, host, hq, hkv, d, causal=True, q_data_type=torch.bfloat16)

    def forward_decode(self, layer: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        kv = self.pool.kv[layer]
        if self.limits.use_trtllm and bs not in self.graph_wrappers:
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.trt_ws,
                block_tables=self.block_tables[:bs],
                seq_lens=self.seq_lens_dev[:bs],
                max_seq_len=self.max_seq_len,
                bmm1_scale=self.sm_scale,
                bmm2_scale=1.0,
            )
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.eager_decode
        out, lse = w.run_return_lse(q, kv)
        if self.peer_kv is not None:
            p_out, p_lse = self.peer_decode.run_return_lse(q, self.peer_kv[layer])  # expect: FC108
            out, _ = merge_state(out, lse, p_out, p_lse)
        return out

    def forward_recompute(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.recompute.run(q, k, v)  # ok: FC108
