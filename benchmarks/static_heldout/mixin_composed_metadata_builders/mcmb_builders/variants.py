"""Builders that override the paged builder's class defaults and hooks: sliding window, trtllm-gen, cascade."""
from __future__ import annotations

import functools
import os
from typing import Dict, List

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, MultiLevelCascadeAttentionWrapper, merge_state
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from mcmb.batches import AttnMetadata, BatchBase, DecodeBatch
from mcmb.config import WsTier
from mcmb_builders.flashinfer_paged import FlashInferPagedBuilder
from mcmb_builders.mixins import WindowClipMixin

LONG_CONTEXT_TOKENS = 65536


class SlidingWindowBuilder(WindowClipMixin, FlashInferPagedBuilder, attn_type="sliding"):
    """Window pages per request plus `global_tokens` at the start of every request, merged by log-sum-exp."""

    def __init__(self, **kw):
        super().__init__(**kw)
        cfg = self.cfg
        self.window_left = cfg.sliding_window - 1
        self.global_workspace = torch.empty(WsTier.WINDOW, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.global_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.global_workspace, self.kv_layout)
        self.global_indptr_cpu = torch.arange(cfg.max_batch_size + 1, dtype=torch.int32)
        self.global_last_cpu = torch.full((cfg.max_batch_size,), max(cfg.global_tokens, 1), dtype=torch.int32)

    def plan_kwargs(self) -> Dict[str, object]:
        kw = super().plan_kwargs()
        kw["window_left"] = self.window_left
        return kw

    def plan_global_tokens(self, batch: BatchBase) -> None:
        bs = batch.num_seqs
        indptr = torch.arange(bs + 1, dtype=torch.int32, device=self.device)
        self.global_wrapper.begin_forward(  # expect: FC102
            indptr, batch.block_table[:, 0].to(torch.int32), self.global_last_cpu[:bs], *self.cfg.dims,
            sm_scale=self._sm_scale)

    def _plan_decode(self, batch: DecodeBatch, indptr: np.ndarray, indices: torch.Tensor, last: np.ndarray) -> None:
        super()._plan_decode(batch, indptr, indices, last)
        if self.cfg.global_tokens:
            self.plan_global_tokens(batch)

    def build_for_cudagraph_capture(self, bs: int) -> AttnMetadata:
        meta = super().build_for_cudagraph_capture(bs)
        if self.cfg.global_tokens:
            self.global_wrapper.plan(  # ok: FC102
                self.global_indptr_cpu[: bs + 1], self.graph_bufs["kv_indices"][:bs], self.global_last_cpu[:bs],
                *self.cfg.dims, sm_scale=self._sm_scale)
        return meta

    def plan_replay(self, bs: int, batch: DecodeBatch) -> None:
        super().plan_replay(bs, batch)
        if self.cfg.global_tokens:
            self.plan_global_tokens(batch)
        # rows whose window ends on a page boundary would report an empty last page
        self.graph_bufs["kv_last_page_len"][:bs].clamp_(min=1)  # expect: FC104

    def run_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        if meta.graph_bs is not None:
            w = self.graph_wrappers[meta.graph_bs]
        else:
            w = self.decode_wrapper
        if not self.cfg.global_tokens:
            return w.run(q, kv_cache)
        o_win, lse_win = w.run_return_lse(q, kv_cache)  # ok: FC108
        o_glob, lse_glob = self.global_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        return merge_state(o_win, lse_win, o_glob, lse_glob)[0]


@functools.lru_cache(maxsize=4)
def trtllm_decode_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


class TrtllmGenBuilder(FlashInferPagedBuilder, attn_type="trtllm_gen"):
    decode_backend = "trtllm-gen"
    kv_layout = "HND"
    supports_cuda_graph = False

    def __init__(self, **kw):
        super().__init__(**kw)
        cfg = self.cfg
        self.block_table_staging = torch.zeros(cfg.max_batch_size, cfg.max_pages_per_seq, dtype=torch.int32, pin_memory=True)
        self.pad_cols = torch.zeros(cfg.max_batch_size, cfg.max_pages_per_seq, dtype=torch.int32, device=self.device)
        self.block_table_gpu = self.pad_cols
        self.seq_lens_gpu = None
        self.max_kv_len = 0

    def _plan_decode(self, batch: DecodeBatch, indptr: np.ndarray, indices: torch.Tensor, last: np.ndarray) -> None:
        bs, width = batch.num_seqs, batch.block_table.shape[1]
        self.max_kv_len = batch.max_kv_len
        if self.block_table_staging.shape[0] < bs:
            self.block_table_staging = torch.empty(2 * bs, width, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.block_table_staging[:bs, :width].copy_(batch.block_table)  # expect: FC101
        self.trace_rows = bs  # the request tracer reads the staged block table
        if self.seq_lens_gpu is None:
            self.seq_lens_gpu = torch.empty(self.cfg.max_batch_size, dtype=torch.int32, device=self.device)  # ok: FC107
        # the trtllm-gen kernels read a fixed-width block table
        self.block_table_gpu = torch.cat([batch.block_table, self.pad_cols[:bs, width:]], dim=1)  # expect: FC107
        args = (torch.from_numpy(indptr), indices, batch.last_page_len_gpu)
        self.decode_wrapper.plan(*args, *self.cfg.dims, **self.plan_kwargs())  # expect: FC102
        self.seq_lens_gpu[:bs].copy_(batch.seq_lens)  # ok: FC104

    def warmup(self) -> None:
        """Plan once at start-up so that the first step does not pay for loading the cubins."""
        c, bs = self.cfg, min(4, self.cfg.max_batch_size)
        self.decode_wrapper.plan(  # ok: FC102
            **dict(indptr=torch.arange(bs + 1, dtype=torch.int32), indices=self.eager_indices[:bs],
                   last_page_len=torch.ones(bs, dtype=torch.int32), num_qo_heads=c.num_qo_heads,
                   num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=c.page_size))

    def run_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        if self.max_kv_len > LONG_CONTEXT_TOKENS:  # ok: FC101
            ws = trtllm_decode_workspace(self.cfg.workspace_bytes(), self.device)
            return trtllm_batch_decode_with_kv_cache(
                q, kv_cache, ws, self.block_table_gpu, self.seq_lens_gpu[: q.shape[0]], self.max_kv_len,
                bmm1_scale=self._sm_scale, bmm2_scale=1.0)
        return self.decode_wrapper.run(q, kv_cache)  # expect: FC108

    def reload_kernels(self) -> None:
        """Drop the JIT module so the next plan() loads the cubins for the current layout."""
        self.decode_wrapper._cached_module = None  # expect: FC103


class CascadeBuilder(FlashInferPagedBuilder, attn_type="cascade"):
    """Two-level cascade for batches that share a system prompt."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self._num_levels = 2  # ok: FC103
        ws_bytes = int(os.environ.get("MCMB_CASCADE_WORKSPACE", 96 * 1024 * 1024))
        self.cascade_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.cascade_wrapper = MultiLevelCascadeAttentionWrapper(self._num_levels, self.cascade_workspace, self.kv_layout)
        self.shared_indices = torch.zeros(0, dtype=torch.int32, device=self.device)
        self.level_indptr_cpu = torch.zeros(1, dtype=torch.int32)
        self.shared_pages = 0

    def _plan_decode(self, batch: DecodeBatch, indptr: np.ndarray, indices: torch.Tensor, last: np.ndarray) -> None:
        if batch.prefix_lens is None:
            self.shared_pages = 0
            return super()._plan_decode(batch, indptr, indices, last)
        bs, shared = batch.num_seqs, batch.prefix_lens.min().item() // self.page_size  # expect: FC101
        self.shared_pages = shared
        self.shared_indices = batch.block_table[0, :shared].clone()  # expect: FC107
        unique_pages = np.diff(indptr) - shared
        self.level_indptr_cpu = torch.cat([torch.zeros(1, dtype=torch.int32), torch.from_numpy(np.cumsum(unique_pages))])  # ok: FC107
        unique = torch.cat([indices[s + shared : e] for s, e in zip(indptr[:-1], indptr[1:])])
        self.cascade_wrapper.plan(  # expect: FC102
            [torch.tensor([0, bs], dtype=torch.int32), torch.arange(bs + 1, dtype=torch.int32, device=self.device)],
            [torch.tensor([0, shared], dtype=torch.int32), self.level_indptr_cpu.int()],
            [self.shared_indices, unique],
            [torch.tensor([self.page_size], dtype=torch.int32), torch.from_numpy(last)],
            *self.cfg.dims, sm_scale=self._sm_scale)

    def run_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttnMetadata) -> torch.Tensor:
        if self.shared_pages == 0:
            return super().run_decode(q, kv_cache, meta)
        return self.cascade_wrapper.run(q, kv_cache)  # expect: FC108

    def level_wrappers(self) -> List[object]:
        return list(self.cascade_wrapper._batch_prefill_wrappers)  # expect: FC103
