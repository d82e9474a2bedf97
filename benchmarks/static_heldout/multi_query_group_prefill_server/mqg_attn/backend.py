"""Ragged prefill for packed chunks (plus the cached prefix of earlier chunks), graph-mode decode buckets, and
a shared-prompt group wrapper for the decode rows that sample many continuations of one prompt."""
from dataclasses import dataclass
from typing import Dict, Optional

import flashinfer
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from mqg import Chunk, ServerConfig
from mqg_attn.merge import merge_chunk_outputs
from mqg_attn.workspaces import decode_workspaces, prefix_workspace, ragged_workspace, trtllm_context_workspace


@dataclass
class DecodeRows:
    kv_indptr_host: torch.Tensor     # pinned, per-sample suffix pages
    kv_indices: torch.Tensor         # device
    last_page_host: torch.Tensor     # pinned
    seq_lens: torch.Tensor           # device
    block_table: torch.Tensor        # device
    group_qo_indptr_host: torch.Tensor
    group_kv_indptr_host: torch.Tensor
    group_indices: torch.Tensor      # device: the shared prompt's pages, once per group
    group_last_page_host: torch.Tensor
    num_groups: int
    max_seq_len: int

    @property
    def batch_size(self) -> int:
        return self.last_page_host.shape[0]


class RaggedPrefillBackend:
    def __init__(self, cfg: ServerConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.sm_scale = cfg.head_dim**-0.5
        self.ragged_workspace = ragged_workspace(device)
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, "NHD")
        self.prefix_workspace = prefix_workspace(cfg, device)
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, cfg.kv_layout, backend="fa2")
        self.group_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, cfg.kv_layout, backend="fa2")
        self.trtllm_workspace = trtllm_context_workspace(device.index or 0, cfg.trtllm_workspace_bytes())
        self.graph_workspace, self.eager_decode_workspace = decode_workspaces(cfg, device)
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.last_plan_info: Optional[object] = None
        self.grouped = False
        self.init_decode_buffers()

    def init_decode_buffers(self) -> None:
        cfg, dev = self.cfg, self.device
        max_bs = cfg.max_decode_batch
        self.dec_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.dec_indices = torch.empty(max_bs * cfg.pages_per_request, dtype=torch.int32, device=dev)
        self.dec_last_page = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.dec_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.dec_last_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        for bs in cfg.decode_buckets:
            self.decode_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, cfg.kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.dec_indptr[: bs + 1],
                paged_kv_indices_buffer=self.dec_indices,
                paged_kv_last_page_len_buffer=self.dec_last_page[:bs],
            )
        self.dec_indices.zero_()  # ok: FC104

    # ---- prefill -----------------------------------------------------------------------------
    def plan_chunk(self, chunk: Chunk) -> str:
        cfg = self.cfg
        if chunk.num_tokens >= cfg.trtllm_threshold:
            return "trtllm"
        self.ragged.plan(  # expect: FC102
            chunk.qo_indptr, chunk.qo_indptr,
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, causal=True, q_data_type=cfg.dtype,
        )
        self.last_plan_info = self.ragged._plan_info  # expect: FC103
        if chunk.has_prefix:
            kw = dict(
                qo_indptr=chunk.qo_indptr_host,
                paged_kv_indptr=chunk.prefix_kv_indptr_gpu,
                paged_kv_indices=chunk.prefix_indices,
                paged_kv_last_page_len=chunk.prefix_last_page_host,
                num_qo_heads=cfg.num_heads,
                num_kv_heads=cfg.num_kv_heads,
                head_dim_qk=cfg.head_dim,
                page_size=cfg.page_size,
                causal=False,
                q_data_type=cfg.dtype,
            )
            self.prefix_wrapper.plan(**kw)  # expect: FC102
        return "fa2"

    def forward_chunk(self, q, k, v, kv_cache: torch.Tensor, chunk: Chunk, kernel: str) -> torch.Tensor:
        if kernel == "trtllm":
            return trtllm_batch_context_with_kv_cache(
                q, kv_cache, self.trtllm_workspace, chunk.block_table, chunk.kv_lens,
                chunk.max_q_len, chunk.max_kv_len, self.sm_scale, 1.0, len(chunk.lens),
                chunk.qo_indptr, chunk.cu_kv_lens,
            )
        o, lse = self.ragged.run(q, k, v, return_lse=True)
        if chunk.has_prefix:
            o_p, lse_p = self.prefix_wrapper.run(q, kv_cache, return_lse=True)
            o, lse = merge_chunk_outputs(o, lse, o_p, lse_p)
        return o

    # ---- decode ------------------------------------------------------------------------------
    def plan_decode_bucket(self, rows: DecodeRows, bucket: int) -> None:
        cfg = self.cfg
        bs = rows.batch_size
        n = int(rows.kv_indptr_host[bs])
        self.dec_indptr_pinned[: bs + 1].copy_(rows.kv_indptr_host)
        self.dec_indptr_pinned[bs + 1 : bucket + 1] = n
        self.dec_last_pinned[:bs].copy_(rows.last_page_host)
        self.dec_indices[:n].copy_(rows.kv_indices, non_blocking=True)  # ok: FC104
        w = self.decode_wrappers[bucket]
        if not w.is_cuda_graph_enabled:  # ok: FC103
            raise RuntimeError(f"decode bucket {bucket} lost CUDA-graph mode")
        w.plan(  # ok: FC102
            self.dec_indptr_pinned[: bucket + 1], self.dec_indices[:n], self.dec_last_pinned[:bucket],
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, q_data_type=cfg.dtype,
        )
        self.grouped = rows.num_groups > 0
        if self.grouped:
            self.group_wrapper.plan(  # ok: FC102
                rows.group_qo_indptr_host, rows.group_kv_indptr_host, rows.group_indices, rows.group_last_page_host,
                cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, causal=False, q_data_type=cfg.dtype,
            )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        o, lse = self.decode_wrappers[bs].run(q, kv_cache, return_lse=True)  # ok: FC108
        if self.grouped:
            o_g, lse_g = self.group_wrapper.run(q, kv_cache, return_lse=True)  # expect: FC108
            o, lse = flashinfer.merge_state(o, lse, o_g, lse_g)
        return o

    def forward_decode_eager(self, q: torch.Tensor, kv_cache: torch.Tensor, rows: DecodeRows) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, self.eager_decode_workspace, rows.block_table, rows.seq_lens, rows.max_seq_len,
            bmm1_scale=self.sm_scale, bmm2_scale=1.0,
        )
