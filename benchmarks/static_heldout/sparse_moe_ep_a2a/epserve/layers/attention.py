"""MLA attention whose metadata is shared by the micro-batches of a two-batch-overlap step.

Each micro-batch owns one row of every metadata buffer (``kv_indptr[mb]``, ``kv_indices[mb]``...); the graph-mode
MLA wrappers of micro-batch ``mb`` are bound to views of that row, one wrapper per batch-size bucket.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from flashinfer import BatchMLAPagedAttentionWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.mla import trtllm_batch_decode_with_kv_cache_mla

from epserve.config import FI_PREFILL_WORKSPACE_BYTES, EPConfig


@functools.lru_cache(maxsize=None)
def _trtllm_mla_workspace(nbytes: int, device: str) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def make_workspace(nbytes: int, device: torch.device, zeroed: bool = True) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        ws.zero_()
    return ws


@dataclass
class MicroBatchMeta:
    micro_batch: Optional[int]          # None: the whole batch runs eagerly, not split
    bucket: int                          # 0: no graph
    batch_size: int
    num_pages: int
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_lens_cpu: torch.Tensor
    kv_indices: torch.Tensor            # device
    kv_lens: torch.Tensor               # device copy, for trtllm-gen
    block_tables: torch.Tensor          # device
    max_kv_len: int
    has_long_rows: bool = False
    long_rows: Optional[torch.Tensor] = None
    long_kv_indptr_cpu: Optional[torch.Tensor] = None
    long_kv_lens_cpu: Optional[torch.Tensor] = None


class MicroBatchAttnBackend:
    def __init__(self, cfg: EPConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        M = cfg.num_micro_batches
        max_bs = cfg.max_batch_size
        max_pages = cfg.max_pages()
        self.sm_scale = cfg.head_dim_qk ** -0.5
        self.qo_indptr = torch.zeros((M, max_bs + 1), dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros((M, max_bs + 1), dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros((M, max_pages), dtype=torch.int32, device=device)
        self.kv_len_arr = torch.zeros((M, max_bs), dtype=torch.int32, device=device)
        self.mb_token_offsets = torch.zeros(M + 1, dtype=torch.int32, device=device)
        self.qo_indptr_cpu = torch.zeros((M, max_bs + 1), dtype=torch.int32, pin_memory=True)
        self.kv_indptr_cpu = torch.zeros((M, max_bs + 1), dtype=torch.int32, pin_memory=True)
        self.kv_len_cpu = torch.zeros((M, max_bs), dtype=torch.int32, pin_memory=True)

        # micro-batches run concurrently on two streams: one workspace each
        self.graph_workspaces = [torch.empty(cfg.mla_workspace_bytes(max_bs), dtype=torch.uint8, device=device) for _ in range(M)]  # ok: FC105
        self.eager_workspace = torch.zeros(cfg.mla_workspace_bytes(max_bs), dtype=torch.uint8, device=device)
        self.prefill_workspace = torch.zeros(FI_PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.tbo_workspaces = [make_workspace(cfg.trtllm_workspace_bytes(), device) for _ in range(M)]

        self.eager_mla = BatchMLAPagedAttentionWrapper(self.eager_workspace, backend="fa2")
        # rows past long_row_threshold are split off and decoded with more KV splits
        self.long_decode = BatchMLAPagedAttentionWrapper(self.eager_mla._float_workspace_buffer, backend="fa2")  # expect: FC103
        self.ragged_prefill = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.graph_mla: List[Dict[int, BatchMLAPagedAttentionWrapper]] = [dict() for _ in range(M)]
        self.graph_bufs: Dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ set-up
    def init_graph_wrappers(self) -> None:
        for mb in range(self.cfg.num_micro_batches):
            for bs in self.cfg.graph_buckets:
                self.graph_mla[mb][bs] = BatchMLAPagedAttentionWrapper(
                    self.graph_workspaces[mb],
                    use_cuda_graph=True,
                    qo_indptr=self.qo_indptr[mb, : bs + 1],
                    kv_indptr=self.kv_indptr[mb, : bs + 1],
                    kv_indices=self.kv_indices[mb],
                    kv_len_arr=self.kv_len_arr[mb, :bs],
                    backend="fa3",
                )
        self.graph_bufs = {"kv_indptr": self.kv_indptr, "kv_indices": self.kv_indices, "kv_len_arr": self.kv_len_arr}
        self.kv_len_arr.fill_(1)  # ok: FC104

    # ------------------------------------------------------------------ per-step preparation
    def _plan_mla(self, wrapper: BatchMLAPagedAttentionWrapper, qo_indptr, kv_indptr, kv_indices, kv_lens) -> None:
        wrapper.plan(
            qo_indptr,
            kv_indptr,
            kv_indices,
            kv_lens,
            self.cfg.num_heads,
            self.cfg.kv_lora_rank,
            self.cfg.qk_rope_head_dim,
            self.cfg.page_size,
            False,
            self.sm_scale,
            torch.bfloat16,
            torch.bfloat16,
        )

    def prepare_micro_batches(self, metas: List[MicroBatchMeta]) -> None:
        offsets = [0]
        for mb, meta in enumerate(metas):
            self.kv_indices[mb, : meta.num_pages].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
            n = meta.bucket + 1
            self.graph_mla[mb][meta.bucket].plan(  # ok: FC102
                meta.qo_indptr_cpu[:n],
                meta.kv_indptr_cpu[:n],
                self.kv_indices[mb],
                meta.kv_lens_cpu[: meta.bucket],
                self.cfg.num_heads,
                self.cfg.kv_lora_rank,
                self.cfg.qk_rope_head_dim,
                self.cfg.page_size,
                False,
                self.sm_scale,
                torch.bfloat16,
                torch.bfloat16,
            )
            offsets.append(offsets[-1] + meta.batch_size)
        # padded rows of the last micro-batch point at the end of its pages
        last = metas[-1]
        self.kv_indptr[len(metas) - 1, last.batch_size + 1 : last.bucket + 1].fill_(last.num_pages)  # expect: FC104
        self.mb_token_offsets[: len(offsets)].copy_(torch.tensor(offsets, dtype=torch.int32), non_blocking=True)  # ok: FC104

    def plan_eager(self, meta: MicroBatchMeta) -> None:
        self.eager_mla.plan(  # expect: FC102
            meta.qo_indptr_cpu[: meta.batch_size + 1],
            meta.kv_indptr_cpu[: meta.batch_size + 1],
            meta.kv_indices,
            meta.kv_lens,
            self.cfg.num_heads,
            self.cfg.kv_lora_rank,
            self.cfg.qk_rope_head_dim,
            self.cfg.page_size,
            False,
            self.sm_scale,
            torch.bfloat16,
            torch.bfloat16,
        )

    def plan_long_rows(self, meta: MicroBatchMeta) -> None:
        n = meta.long_kv_lens_cpu.numel()
        qo = torch.arange(n + 1, dtype=torch.int32)
        self._plan_mla(self.long_decode, qo, meta.long_kv_indptr_cpu, meta.kv_indices, meta.long_kv_lens_cpu)

    def plan_prefill(self, extend_lens_cpu: torch.Tensor) -> None:
        qo_indptr_host = torch.zeros(extend_lens_cpu.numel() + 1, dtype=torch.int32)
        qo_indptr_host[1:] = torch.cumsum(extend_lens_cpu, dim=0)
        plan = functools.partial(
            self.ragged_prefill.plan,
            num_qo_heads=self.cfg.num_heads,
            num_kv_heads=self.cfg.num_heads,
            head_dim_qk=self.cfg.head_dim_qk,
            head_dim_vo=self.cfg.v_head_dim,
            causal=True,
            sm_scale=self.sm_scale,
        )
        plan(qo_indptr_host, qo_indptr_host)  # ok: FC102

    # ------------------------------------------------------------------ kernels
    def forward_decode(self, q_nope, q_pe, ckv_cache, kpe_cache, meta: MicroBatchMeta) -> torch.Tensor:
        if meta.micro_batch is None or meta.bucket == 0:
            wrapper = self.eager_mla
        else:
            wrapper = self.graph_mla[meta.micro_batch][meta.bucket]
        return wrapper.run(q_nope, q_pe, ckv_cache, kpe_cache)  # ok: FC108

    def forward_long_rows(self, q_nope, q_pe, ckv_cache, kpe_cache, meta: MicroBatchMeta) -> torch.Tensor:
        return self.long_decode.run(q_nope, q_pe, ckv_cache, kpe_cache)  # expect: FC108

    def forward_tbo_trtllm(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: MicroBatchMeta) -> torch.Tensor:
        ws = self.tbo_workspaces[meta.micro_batch]
        return trtllm_batch_decode_with_kv_cache_mla(
            query, kv_cache, ws, self.cfg.qk_nope_head_dim, self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim,
            meta.block_tables, meta.kv_lens, meta.max_kv_len, bmm1_scale=self.sm_scale,
        )

    def forward_large_batch(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: MicroBatchMeta) -> torch.Tensor:
        ws = _trtllm_mla_workspace(self.cfg.trtllm_workspace_bytes(), str(self.device))
        return trtllm_batch_decode_with_kv_cache_mla(
            query, kv_cache, ws, self.cfg.qk_nope_head_dim, self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim,
            meta.block_tables, meta.kv_lens, meta.max_kv_len, bmm1_scale=self.sm_scale,
        )

    def forward_prefill(self, q, k, v) -> torch.Tensor:
        return self.ragged_prefill.run(q, k, v)


class MLAAttention(nn.Module):
    def __init__(self, cfg: EPConfig, layer_id: int, backend: MicroBatchAttnBackend, kv_pool):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.kv_pool = kv_pool
        H = cfg.num_heads
        self.q_proj = nn.Linear(cfg.hidden_size, H * cfg.head_dim_qk, bias=False)
        self.kv_a_proj = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.w_kc = nn.Parameter(torch.empty(H, cfg.qk_nope_head_dim, cfg.kv_lora_rank))
        self.w_vc = nn.Parameter(torch.empty(H, cfg.kv_lora_rank, cfg.v_head_dim))
        self.o_proj = nn.Linear(H * cfg.v_head_dim, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, meta: MicroBatchMeta) -> torch.Tensor:
        cfg = self.cfg
        q = self.q_proj(h).view(-1, cfg.num_heads, cfg.head_dim_qk)
        q_nope, q_pe = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        q_nope = torch.einsum("thd,hdc->thc", q_nope, self.w_kc)
        ckv, kpe = self.kv_a_proj(h).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        self.kv_pool.store(self.layer_id, ckv, kpe, positions, meta)
        ckv_cache, kpe_cache = self.kv_pool.layer(self.layer_id)
        if meta.bucket == 0 and meta.batch_size > cfg.max_batch_size // 2:
            out = self.backend.forward_large_batch(torch.cat([q_nope, q_pe], -1), self.kv_pool.fused(self.layer_id), meta)
        elif meta.micro_batch is not None and cfg.use_trtllm_tbo:
            out = self.backend.forward_tbo_trtllm(torch.cat([q_nope, q_pe], -1), self.kv_pool.fused(self.layer_id), meta)
        else:
            out = self.backend.forward_decode(q_nope, q_pe, ckv_cache, kpe_cache, meta)
            if meta.has_long_rows:
                rows = meta.long_rows
                out[rows] = self.backend.forward_long_rows(q_nope[rows], q_pe[rows], ckv_cache, kpe_cache, meta)
        out = torch.einsum("thc,hcd->thd", out, self.w_vc)
        return self.o_proj(out.reshape(-1, cfg.num_heads * cfg.v_head_dim))
