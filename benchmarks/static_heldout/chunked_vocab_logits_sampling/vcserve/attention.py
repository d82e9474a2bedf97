"""Decode attention over each request's recent window, plus its sink page through a second wrapper."""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, merge_state
from flashinfer.decode import trtllm_batch_decode_with_kv_cache as trt_decode

from vcserve.kv import DecodeBatch, SinkPagePool
from vocabchunk.settings import ChunkSettings, default_decode_workspace_bytes


class SinkDecodeAttention:
    def __init__(self, s: ChunkSettings, pool: SinkPagePool, device: torch.device) -> None:
        self.s = s
        self.pool = pool
        self.device = device
        self.page_size = s.page_size
        self.sm_scale = s.head_dim**-0.5
        max_bs = s.max_graph_bs
        self.graph_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.graph_indices = torch.zeros(max_bs * s.window_pages, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_ws = torch.empty(s.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

        self.eager_ws = torch.empty(default_decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_eager = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "NHD", use_tensor_cores=True)
        self.eager_indptr_dev = torch.zeros(s.max_batch + 1, dtype=torch.int32, device=device)

        self.sink_ws = torch.empty(s.sink_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.sink_decode = BatchDecodeWithPagedKVCacheWrapper(self.sink_ws, "NHD")

        self.trt_ws = torch.empty(s.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.block_tables = torch.zeros(s.max_batch, s.window_pages + 1, dtype=torch.int32, device=device)
        self.seq_lens_dev = torch.zeros(s.max_batch, dtype=torch.int32, device=device)
        self.max_seq_len = s.max_context
        self.use_trtllm = False

    def _heads(self):
        return self.s.num_qo_heads, self.s.num_kv_heads, self.s.head_dim, self.page_size

    # ------------------------------------------------------------------ graphs

    def bind_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        self.graph_last_page_len[:bs].fill_(1)  # ok: FC104
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.graph_indptr[: bs + 1],
            paged_kv_indices_buffer=self.graph_indices,
            paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def _fill_pinned(self, bs: int, batch: DecodeBatch) -> None:
        n = batch.size
        self.indptr_pinned[: n + 1].copy_(batch.kv_indptr_host)
        self.indptr_pinned[n + 1 : bs + 1].fill_(batch.num_pages_host)
        self.last_pinned[:n].copy_(batch.kv_last_page_host)
        self.last_pinned[n:bs].fill_(1)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, batch: DecodeBatch) -> None:
        w = self.bind_graph_wrapper(bs)
        self._fill_pinned(bs, batch)
        hq, hkv, d, ps = self._heads()
        w.plan(self.indptr_pinned[: bs + 1], self.graph_indices[: batch.num_pages_host], self.last_pinned[:bs],
               hq, hkv, d, ps, data_type=torch.bfloat16)
        self._plan_sinks(batch, bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: DecodeBatch) -> None:
        n = batch.size
        nnz = batch.num_pages_host
        self.graph_indices[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self._fill_pinned(bs, batch)
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
        self._plan_sinks(batch, bs)
        # the page-count prefix sum the window-eviction kernel reads
        torch.cumsum(batch.pages_per_req, 0, dtype=torch.int32, out=self.graph_indptr[1 : n + 1])  # expect: FC104

    # ------------------------------------------------------------------ eager

    def init_forward_metadata(self, batch: DecodeBatch) -> None:
        n = batch.size
        self._plan_sinks(batch, n)
        self.use_trtllm = self.s.use_trtllm
        if self.use_trtllm:
            self.block_tables[:n].copy_(batch.block_table_host, non_blocking=True)
            self.seq_lens_dev[:n].copy_(batch.seq_lens_cpu, non_blocking=True)
            return
        torch.cumsum(batch.pages_per_req, 0, dtype=torch.int32, out=self.eager_indptr_dev[1 : n + 1])
        hq, hkv, d, ps = self._heads()
        plan_kw = {
            "indptr": self.eager_indptr_dev[: n + 1],
            "indices": batch.kv_indices,
            "last_page_len": batch.kv_last_page_host,
            "num_qo_heads": hq,
            "num_kv_heads": hkv,
            "head_dim": d,
            "page_size": ps,
            "data_type": torch.bfloat16,
        }
        self.decode_eager.plan(**plan_kw)  # expect: FC102

    def _plan_sinks(self, batch: DecodeBatch, bs: int) -> None:
        """Every row attends its first page; padded rows attend the null page."""
        first = np.zeros(bs, dtype=np.int32)
        first[: batch.size] = batch.first_pages_np
        hq, hkv, d, ps = self._heads()
        self.sink_decode.plan(  # ok: FC102
            torch.from_numpy(np.arange(bs + 1, dtype=np.int32)),
            torch.from_numpy(first).to(self.device, non_blocking=True),
            torch.from_numpy(np.full(bs, ps, dtype=np.int32)),
            hq,
            hkv,
            d,
            ps,
            data_type=torch.bfloat16,
        )

    # ------------------------------------------------------------------ forward

    def attend_sinks(self, layer: int, q: torch.Tensor):
        return self.sink_decode.run(q, self.pool.kv(layer), return_lse=True)  # expect: FC108

    def forward_decode(self, layer: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        kv = self.pool.kv(layer)
        if self.use_trtllm and bs not in self.graph_wrappers:
            return trt_decode(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.trt_ws,
                block_tables=self.block_tables[:bs],
                seq_lens=self.seq_lens_dev[:bs],
                max_seq_len=self.max_seq_len,
                bmm1_scale=self.sm_scale,
                bmm2_scale=1.0,
            )
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.decode_eager
        out, lse = w.run(q, kv, return_lse=True)  # ok: FC108
        s_out, s_lse = self.attend_sinks(layer, q)
        out, _ = merge_state(out, lse, s_out, s_lse)
        return out
