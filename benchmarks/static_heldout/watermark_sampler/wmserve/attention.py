from __future__ import annotations

import functools
import math
from typing import Dict, List

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from wmserve.config import EngineLimits, default_workspace_bytes
from wmserve.step import PrefillInputs


class DecodeAttention:
    def __init__(self, limits: EngineLimits, device: torch.device):
        self.limits = limits
        self.device = device
        L = limits
        self._sm_scale = 1.0 / math.sqrt(L.head_dim)
        self.graph_workspace = torch.empty(L.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill_workspace = torch.zeros(default_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.ctx_workspace = torch.empty(L.ctx_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        pp_bytes = L.max_batch * L.num_qo_heads * (L.head_dim + 1) * 4 * 16
        self.pingpong_workspaces = [torch.zeros(pp_bytes, dtype=torch.uint8, device=device) for _ in range(2)]  # ok: FC106

        self.kv_indptr = torch.zeros(L.max_graph_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(L.max_graph_bs * (L.max_seq_len // L.page_size), dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(L.max_graph_bs, dtype=torch.int32, device=device)
        self.dummy_indptr_host = torch.arange(L.max_graph_bs + 1, dtype=torch.int32)
        self.dummy_last_host = torch.ones(L.max_graph_bs, dtype=torch.int32)

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        # double-buffered planning: plan step t+1 on the host while step t still runs on the other wrapper
        self.pingpong: List[BatchDecodeWithPagedKVCacheWrapper] = [
            BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True) for ws in self.pingpong_workspaces
        ]
        self.parity = 0
        self.double_buffer_plans = L.double_buffer_plans
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.active_bs = 1
        self.kv_cache: List[torch.Tensor] = []

    def graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        L = self.limits
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend="fa2",
        )
        if self.graph_wrappers:
            first = next(iter(self.graph_wrappers.values()))
            shared = first.__dict__.get("_float_workspace_buffer")  # expect: FC103
            if shared is not None and shared.data_ptr() != self.graph_workspace.data_ptr():
                raise RuntimeError("graph wrappers must share one float workspace")
        plan = functools.partial(w.plan, num_qo_heads=L.num_qo_heads, num_kv_heads=L.num_kv_heads,
                                 head_dim=L.head_dim, page_size=L.page_size, q_data_type=torch.bfloat16)
        plan(self.dummy_indptr_host[: bs + 1], self.kv_indices[:bs], self.dummy_last_host[:bs])  # ok: FC102
        self.graph_wrappers[bs] = w
        return w

    def plan_pingpong(self, step) -> None:
        L = self.limits
        self.parity ^= 1
        self.pingpong[self.parity].plan(step.kv_indptr_host, step.kv_indices, step.kv_last_page_len_host,
                                        L.num_qo_heads, L.num_kv_heads, L.head_dim, L.page_size,
                                        q_data_type=torch.bfloat16)

    def plan_prefill(self, pre: PrefillInputs) -> None:
        L = self.limits
        if L.use_trtllm_context:
            return
        self.prefill.plan(pre.qo_indptr_host, pre.kv_indptr_host, pre.kv_indices, pre.kv_last_page_len_host,  # ok: FC102
                          L.num_qo_heads, L.num_kv_heads, L.head_dim, L.page_size, causal=True,
                          q_data_type=torch.bfloat16)

    def forward_decode(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        if self.double_buffer_plans:
            return self.pingpong[self.parity].run(q, kv)  # expect: FC108
        return self.graph_wrappers[self.active_bs].run(q, kv)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, layer_id: int, pre: PrefillInputs) -> torch.Tensor:
        kv = self.kv_cache[layer_id]
        if self.limits.use_trtllm_context:
            return trtllm_batch_context_with_kv_cache(
                q, kv, self.ctx_workspace, pre.block_tables, pre.seq_lens, pre.max_q_len, pre.max_kv_len,
                bmm1_scale=self._sm_scale, bmm2_scale=1.0, batch_size=pre.seq_lens.shape[0],
                cum_seq_lens_q=pre.qo_indptr_host.to(q.device), cum_seq_lens_kv=pre.kv_indptr_host.to(q.device),
            )
        return self.prefill.run(q, kv)
