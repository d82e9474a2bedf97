"""Attention for the prompt-cache server: FA2 or trtllm-gen prefill, graph-mode decode per bucket."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import torch
import torch.nn.functional as F
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import fast_decode_plan
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from ecache import EmbeddingLRU, ServerConfig
from ec_attn.workspace import fa2_prefill_workspace, trtllm_context_workspace


@dataclass
class PrefillBatch:
    qo_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    page_counts: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    max_q_len: int
    max_kv_len: int

    @property
    def num_rows(self) -> int:
        return self.qo_indptr_cpu.shape[0] - 1


class CachedPromptBackend:
    WORKSPACE_BYTES = 128 * 1024 * 1024

    def __init__(self, cfg: ServerConfig, kv_cache: torch.Tensor, lru: EmbeddingLRU, device: torch.device):
        self.cfg, self.kv_cache, self.lru, self.device = cfg, kv_cache, lru, device
        self._kv_layout = "NHD"  # ok: FC103
        max_bs = cfg.max_batch_size
        max_pages = max_bs * cfg.max_pages_per_seq
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_hostbuf = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_hostbuf = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_last_hostbuf = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.last_dev = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.decode_ws = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_ws = fa2_prefill_workspace(cfg, device)
        self.ctx_ws = trtllm_context_workspace(cfg, device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        # one row decodes faster on the CUDA-core kernel than on the tensor-core graphs
        self.single_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, self._kv_layout)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, self._kv_layout)
        self._plan_fn = fast_decode_plan
        self._heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self._ctx: Dict[str, object] = {}

    def init_decode_buffers(self, buckets: List[int]) -> None:
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.decode_ws, self._kv_layout, use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def _fill_hostbuf(self, bs: int, padded: int, seq_lens_np: np.ndarray, page_lists: List[List[int]]) -> int:
        counts = np.array([len(p) for p in page_lists[:bs]] + [0] * (padded - bs), dtype=np.int32)
        indptr = self.kv_indptr_hostbuf.numpy()
        indptr[0] = 0
        np.cumsum(counts, out=indptr[1 : padded + 1])
        total = int(indptr[padded])
        if total:
            self.kv_indices_hostbuf.numpy()[:total] = np.concatenate([np.asarray(p) for p in page_lists[:bs]])
        last = self.kv_last_hostbuf.numpy()
        last[:padded] = 1
        last[:bs] = (seq_lens_np[:bs] - 1) % self.cfg.page_size + 1
        return total

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.kv_indptr_hostbuf[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_indices_hostbuf[:bs] = 0
        self.kv_last_hostbuf[:bs] = 1
        self._plan_fn(self.graph_wrappers[bs], self.kv_indptr_hostbuf[: bs + 1],  # ok: FC102
                      self.kv_indices_hostbuf[:bs], self.kv_last_hostbuf[:bs], *self._heads)
        if bs == 1:
            self.single_decode.plan(self.kv_indptr_hostbuf[:2], self.kv_indices_hostbuf[:1],
                                    self.kv_last_hostbuf[:1], *self._heads)

    def _plan_bucket(self, padded: int, total: int) -> None:
        # exact lengths from the device sequence lengths: the host copy lags by one step
        # for rows admitted in this step
        self._plan_fn(self.graph_wrappers[padded], self.kv_indptr_hostbuf[: padded + 1],  # expect: FC102
                      self.kv_indices[:total], self.last_dev[:padded], *self._heads)

    def prepare_decode(self, bs: int, padded: int, seq_lens: torch.Tensor, seq_lens_np: np.ndarray,
                       page_lists: List[List[int]]) -> None:
        total = self._fill_hostbuf(bs, padded, seq_lens_np, page_lists)
        self.kv_indices[:total].copy_(self.kv_indices_hostbuf[:total], non_blocking=True)  # ok: FC104
        torch.remainder(seq_lens[:padded] - 1, self.cfg.page_size, out=self.last_dev[:padded])
        self.last_dev[:padded] += 1
        if padded == 1:
            self.single_decode.plan(self.kv_indptr_hostbuf[:2], self.kv_indices[:total],
                                    self.kv_last_hostbuf[:1], *self._heads)
        self._plan_bucket(padded, total)
        # padding rows must stay empty whatever the host fill raced with
        self.kv_indptr[bs + 1 : padded + 1] = self.kv_indptr[bs]  # expect: FC104

    def init_forward_metadata(self, batch: PrefillBatch) -> None:
        n = batch.num_rows
        if self.cfg.prefill_backend == "trtllm":
            cum_kv = F.pad(torch.cumsum(batch.seq_lens, 0, dtype=torch.int32), (1, 0))
            self._ctx = dict(seq_lens=batch.seq_lens, block_tables=batch.block_tables, max_q_len=batch.max_q_len,
                             max_kv_len=batch.max_kv_len, batch_size=n, cum_seq_lens_kv=cum_kv,
                             cum_seq_lens_q=batch.qo_indptr_cpu.to(self.device, non_blocking=True))
            return
        # pages per row: the cached prompt pages copied in plus the freshly allocated ones
        kv_indptr = F.pad(torch.cumsum(batch.page_counts, 0, dtype=torch.int32), (1, 0))
        self.prefill.begin_forward(  # expect: FC102
            batch.qo_indptr_cpu, kv_indptr, batch.kv_indices, batch.last_page_len_cpu, *self._heads[:3],
            self.cfg.page_size, causal=True)

    def forward_extend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        if self.cfg.prefill_backend == "trtllm":
            return trtllm_batch_context_with_kv_cache(
                query=q, kv_cache=self.kv_cache[layer], workspace_buffer=self.ctx_ws,
                bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0, **self._ctx)
        return self.prefill.run(q, self.kv_cache[layer])

    def forward_decode(self, q: torch.Tensor, layer: int, bs: int) -> torch.Tensor:
        if bs == 1:
            return self.single_decode.run(q, self.kv_cache[layer])  # expect: FC108
        return self.graph_wrappers[bs].run(q, self.kv_cache[layer])  # ok: FC108
