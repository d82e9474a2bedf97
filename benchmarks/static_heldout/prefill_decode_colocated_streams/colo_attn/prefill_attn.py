"""Prefill attention: FA2 paged prefill, trtllm context attention for very long prompts."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from colo import EngineConfig, PrefillBatch
from colo_attn.workspaces import alloc_ctx_workspace, prefill_workspace_bytes


class LongContextPrefill:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.workspace = alloc_ctx_workspace(prefill_workspace_bytes(cfg), device)
        self.bmm1_scale = cfg.head_dim**-0.5

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: PrefillBatch, max_q: int, max_kv: int):
        return trtllm_batch_context_with_kv_cache(
            q,
            kv_cache,
            self.workspace,
            block_tables=batch.block_tables,
            seq_lens=batch.kv_lens,
            max_q_len=max_q,
            max_kv_len=max_kv,
            bmm1_scale=self.bmm1_scale,
            bmm2_scale=1.0,
            batch_size=batch.batch_size,
            cum_seq_lens_q=batch.qo_indptr,
            cum_seq_lens_kv=batch.kv_cu_lens,
        )


class PrefillAttention:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.workspace = torch.empty(prefill_workspace_bytes(cfg), dtype=torch.uint8, device=device)  # ok: FC106
        self.wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.long = LongContextPrefill(cfg, device)
        self.batch: Optional[PrefillBatch] = None
        self.max_q = 0
        self.max_kv = 0
        self.use_long = False

    def plan_prefill(self, batch: PrefillBatch) -> None:
        self.batch = batch
        self.max_q = int(batch.qo_lens.max())  # expect: FC101
        self.max_kv = int(np.max(batch.kv_lens_np))  # ok: FC101
        self.use_long = self.max_kv > self.cfg.long_context_threshold
        if self.use_long:
            return
        self.wrapper.plan(  # expect: FC102
            batch.qo_indptr,
            batch.kv_indptr_cpu,
            batch.kv_indices,
            batch.last_page_len_cpu,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.use_long and self.batch is not None:
            return self.long.forward(q, kv_cache, self.batch, self.max_q, self.max_kv)
        return self.wrapper.run(q, kv_cache)
