"""Attention of the agent server.

Decode: graph-mode decode wrappers per bucket over one page table, plus the
tool-schema prefix every agent request shares (prefilled once, attended through
a separate prefix wrapper and merged by log-sum-exp).
Resume: when a tool returns, its output is prefilled on top of the request's
parked pages with a paged prefill (trtllm-gen's context kernel on Blackwell).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    merge_state,
    trtllm_batch_context_with_kv_cache,
    trtllm_batch_decode_with_kv_cache,
)

from agentsrv.requests import AgentRequest
from agentsrv.settings import AgentSettings
from agentsrv_core.workspaces import get_context_workspace, zeroed_decode_workspace


class AgentAttention:
    GRAPH_WORKSPACE_BYTES = 384 << 20

    def __init__(self, settings: AgentSettings, kv_cache: List[torch.Tensor], device: torch.device):
        s = settings
        self.s = s
        self.device = device
        self.kv_cache = kv_cache
        self.sm_scale = 1.0 / math.sqrt(s.head_dim)
        self.graph_workspace = torch.empty(self.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.resume_workspace = torch.empty(s.max_tool_output_tokens * s.num_qo_heads * s.head_dim * 4, dtype=torch.uint8, device=device)  # ok: FC106
        self.decode_trt_workspace = zeroed_decode_workspace(s, device)
        self.context_workspace = get_context_workspace(device, s.resume_workspace_bytes())

        max_bs = s.max_batch_size
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(s.num_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.block_tables = torch.zeros((max_bs, s.max_pages_per_req), dtype=torch.int32, device=device)
        self.seq_lens_dev = torch.ones(max_bs, dtype=torch.int32, device=device)

        n = s.max_resume_batch
        self.resume_qo_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.resume_qo_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.resume_kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.resume_kv_indices = torch.zeros(s.num_pages, dtype=torch.int32, device=device)
        self.resume_kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.resume_last_host = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.resume_block_tables = torch.zeros((n, s.max_pages_per_req), dtype=torch.int32, device=device)
        self.resume_seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.resume_max_q = 0

        self.schema_indices = torch.zeros(0, dtype=torch.int32, device=device)
        self.num_schema_pages = 0

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.graph_workspace, "NHD", use_tensor_cores=True)
        self.schema_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.graph_workspace, "NHD")
        self.resume_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.resume_workspace, "NHD", backend="fa2")
        self.forward_wrapper: BatchDecodeWithPagedKVCacheWrapper = self.eager_decode
        self.in_graph = False

    # ------------------------------------------------------------------ set-up
    def set_tool_schema(self, page_ids: List[int]) -> None:
        self.num_schema_pages = len(page_ids)
        self.schema_indices = torch.tensor(page_ids, dtype=torch.int32, device=self.device)

    def build_graph_wrapper(self, bs: int) -> None:
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )

    # ---------------------------------------------------- decode preparation
    def prepare_decode(self, reqs: Sequence[AgentRequest], bs: int) -> None:
        s = self.s
        raw_bs = len(reqs)
        indptr = self.kv_indptr_host.numpy()
        last = self.kv_last_page_len_host.numpy()
        indptr[0] = 0
        flat: List[int] = []
        for i, r in enumerate(reqs):
            flat.extend(r.pages)
            indptr[i + 1] = indptr[i] + len(r.pages)
            last[i] = r.last_page_len
        indptr[raw_bs + 1 : bs + 1] = indptr[raw_bs]
        last[raw_bs:bs] = 1
        nnz = len(flat)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(torch.tensor(flat, dtype=torch.int32), non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_host[:bs], non_blocking=True)
        if bs in self.graph_wrappers:
            self.in_graph = True
            self.forward_wrapper = self.graph_wrappers[bs]
            self.forward_wrapper.plan(  # ok: FC102
                self.kv_indptr_host[: bs + 1],
                self.kv_indices[:nnz],
                self.kv_last_page_len_host[:bs],
                s.num_qo_heads,
                s.num_kv_heads,
                s.head_dim,
                s.page_size,
                q_data_type=torch.bfloat16,
            )
        else:
            self.in_graph = False
            self.forward_wrapper = self.eager_decode
            plan_args = (self.kv_indptr_host[: bs + 1], self.kv_indices[:nnz], self.kv_last_page_len_host[:bs])
            self.eager_decode.plan(*plan_args, s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size, q_data_type=torch.bfloat16)  # ok: FC102
        self._plan_schema(bs)
        # a row whose last page was just parked reports 0 tokens; the kernel needs >= 1
        torch.clamp(self.kv_last_page_len[:bs], min=1, out=self.kv_last_page_len[:bs])  # expect: FC104

    def _plan_schema(self, bs: int) -> None:
        s = self.s
        qo_indptr = torch.arange(bs + 1, dtype=torch.int32)
        kv_indptr = qo_indptr * self.num_schema_pages
        last = torch.full((bs,), s.page_size, dtype=torch.int32)
        self.schema_wrapper.plan(
            qo_indptr, kv_indptr, self.schema_indices.repeat(bs), last,
            s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size, causal=False, q_data_type=torch.bfloat16,
        )

    # ---------------------------------------------------- resume preparation
    def prepare_resume(self, reqs: Sequence[AgentRequest]) -> None:
        """Plans the prefill of each resumed request's tool output over its parked pages."""
        s = self.s
        n = len(reqs)
        tool_lens = torch.tensor([len(r.tool_output_ids) for r in reqs], dtype=torch.int32)
        self.resume_qo_lens[:n].copy_(tool_lens, non_blocking=True)
        torch.cumsum(self.resume_qo_lens[:n], 0, out=self.resume_qo_indptr[1 : n + 1])
        kv_indptr = self.resume_kv_indptr_host.numpy()
        kv_indptr[0] = 0
        flat: List[int] = []
        for i, r in enumerate(reqs):
            flat.extend(r.pages)
            kv_indptr[i + 1] = kv_indptr[i] + len(r.pages)
            self.resume_last_host[i] = r.last_page_len
        nnz = len(flat)
        self.resume_kv_indices[:nnz].copy_(torch.tensor(flat, dtype=torch.int32), non_blocking=True)
        self.resume_kv_indptr[: n + 1].copy_(self.resume_kv_indptr_host[: n + 1], non_blocking=True)
        self.resume_max_q = self.resume_qo_lens[:n].max().item()  # expect: FC101
        if s.use_trtllm:
            self._fill_resume_block_tables(reqs)
            return
        self.resume_wrapper.plan(  # expect: FC102
            **dict(
                qo_indptr=self.resume_qo_indptr[: n + 1],
                paged_kv_indptr=self.resume_kv_indptr_host[: n + 1],
                paged_kv_indices=self.resume_kv_indices[:nnz],
                paged_kv_last_page_len=self.resume_last_host[:n],
                num_qo_heads=s.num_qo_heads,
                num_kv_heads=s.num_kv_heads,
                head_dim_qk=s.head_dim,
                page_size=s.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
            )
        )

    def _fill_resume_block_tables(self, reqs: Sequence[AgentRequest]) -> None:
        rows = torch.zeros((len(reqs), self.s.max_pages_per_req), dtype=torch.int32)
        lens = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        for i, r in enumerate(reqs):
            rows[i, : len(r.pages)] = torch.tensor(r.pages, dtype=torch.int32)
        self.resume_block_tables[: len(reqs)].copy_(rows, non_blocking=True)
        self.resume_seq_lens[: len(reqs)].copy_(lens, non_blocking=True)

    # ----------------------------------------------------------------- forward
    def decode(self, q: torch.Tensor, layer_id: int, bs: int) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        if self.s.use_trtllm and not self.in_graph:
            return trtllm_batch_decode_with_kv_cache(
                q, kv, self.decode_trt_workspace, self.block_tables[:bs], self.seq_lens_dev[:bs],
                self.s.max_seq_len, bmm1_scale=self.sm_scale, bmm2_scale=1.0,
            )
        o, lse = self.forward_wrapper.run(q, kv, return_lse=True)  # ok: FC108
        if self.num_schema_pages:
            o_schema, lse_schema = self.schema_wrapper.run_return_lse(q, kv)  # expect: FC108
            o, lse = merge_state(o, lse, o_schema, lse_schema)
        return o

    def prefill_resume(self, q: torch.Tensor, layer_id: int, n: int) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        if self.s.use_trtllm:
            return trtllm_batch_context_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.context_workspace,
                block_tables=self.resume_block_tables[:n],
                seq_lens=self.resume_seq_lens[:n],
                max_q_len=self.resume_max_q,
                max_kv_len=self.s.max_seq_len,
                bmm1_scale=self.sm_scale,
                bmm2_scale=1.0,
                batch_size=n,
                cum_seq_lens_q=self.resume_qo_indptr[: n + 1],
                cum_seq_lens_kv=self.resume_kv_indptr[: n + 1],
            )
        return self.resume_wrapper.run(q, kv)
