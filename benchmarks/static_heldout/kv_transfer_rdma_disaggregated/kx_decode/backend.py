"""Decode attention: graph-mode wrappers per bucket over the mapped page table."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from kvx import GRAPH_WORKSPACE_BYTES, PageMapper, TransferConfig
from kx_decode.workspace import overflow_workspace, split_workspace_bytes, tail_workspace


class DecodeAttnBackend:
    def __init__(self, cfg: TransferConfig, mapper: PageMapper, device: torch.device):
        self.cfg = cfg
        self.mapper = mapper
        self.device = device
        max_bs = cfg.max_batch
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)

        self.graph_workspace = torch.zeros(GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        split_bytes = split_workspace_bytes(max_bs, cfg.num_qo_heads, cfg.head_dim, cfg.max_context)
        self.eager_workspace = torch.zeros(split_bytes, dtype=torch.uint8, device=device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            for bs in cfg.buckets
        }
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD")
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD")
        self.tail_prefill = BatchPrefillWithPagedKVCacheWrapper(tail_workspace(device, split_bytes), "NHD", backend="trtllm-gen")
        self.plan_kw = dict(num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                            page_size=cfg.page_size, q_data_type=torch.bfloat16)
        self._sm_scale = cfg.head_dim ** -0.5  # ok: FC103
        self.bucket: Optional[int] = None

    def init_decode_buffers(self) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def plan_for_capture(self, bs: int) -> None:
        t = self.mapper.table
        t.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.graph_wrappers[bs].plan(t.kv_indptr_host[: bs + 1], self.kv_indices, t.last_page_len_host[:bs], **self.plan_kw)  # ok: FC102
        self.window_decode.plan(
            t.kv_indptr_host[: bs + 1], self.kv_indices, t.last_page_len_host[:bs],
            window_left=self.cfg.window, **self.plan_kw,
        )
        self.bucket = bs

    def prepare_bucket(self, bs: int, n: int) -> None:
        t = self.mapper.table
        nnz = int(t.kv_indptr_host[n])
        t.kv_indptr_host[n + 1 : bs + 1] = nnz
        self.kv_indices[:nnz].copy_(t.kv_indices[:nnz])  # ok: FC104
        self.graph_wrappers[bs].plan(t.kv_indptr[: bs + 1], self.kv_indices[:nnz], t.last_page_len_host[:bs], **self.plan_kw)  # expect: FC102
        self.window_decode.plan(
            t.kv_indptr_host[: bs + 1], self.kv_indices[:nnz], t.last_page_len_host[:bs],
            window_left=self.cfg.window, **self.plan_kw,
        )
        # the token this step appends lands on the last page
        self.kv_last_page_len[:n].add_(1)  # expect: FC104
        self.bucket = bs

    def plan_eager(self, n: int) -> None:
        t = self.mapper.table
        nnz = int(t.kv_indptr_host[n])
        kw = dict(indptr=t.kv_indptr_host[: n + 1], indices=t.kv_indices[:nnz], last_page_len=t.last_page_len[:n])
        self.eager_decode.plan(**kw, **self.plan_kw)  # expect: FC102
        self.window_decode.plan(
            t.kv_indptr_host[: n + 1], t.kv_indices[:nnz], t.last_page_len_host[:n],
            window_left=self.cfg.window, **self.plan_kw,
        )
        self.bucket = None

    def plan_tail(self, tail_lens_np: np.ndarray, n: int) -> None:
        t = self.mapper.table
        nnz = int(t.kv_indptr_host[n])
        qo_indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(tail_lens_np)]).astype(np.int32))
        self.tail_prefill.plan(  # ok: FC102
            qo_indptr, t.kv_indptr_host[: n + 1], t.kv_indices[:nnz], t.last_page_len_host[:n],
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size, causal=True,
        )

    def rebind_indices(self, new_indices: torch.Tensor) -> None:
        """Point every graph at a larger indices buffer after the page pool grew."""
        self.kv_indices = new_indices
        for w in self.graph_wrappers.values():
            w._paged_kv_indices_buf = new_indices  # expect: FC103

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        if layer_id % 2 == 1:
            return self.window_decode.run(q, kv_cache)  # expect: FC108
        w = self.graph_wrappers[self.bucket] if self.bucket is not None else self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_tail(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.tail_prefill.run(q, kv_cache)

    def forward_overflow(self, q, kv_cache, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int):
        cfg = self.cfg
        ws = overflow_workspace(self.device, split_workspace_bytes(cfg.max_batch, cfg.num_qo_heads, cfg.head_dim, cfg.max_context))
        return trtllm_batch_decode_with_kv_cache(
            query=q, kv_cache=kv_cache, workspace_buffer=ws, block_tables=block_tables, seq_lens=seq_lens,
            max_seq_len=max_seq_len, bmm1_scale=self._sm_scale, bmm2_scale=1.0,
        )
