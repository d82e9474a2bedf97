"""The prefill node's attention: FA2 paged prefill over the prompt."""

from __future__ import annotations

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from kvx import TransferConfig


class PrefillAttention:
    def __init__(self, cfg: TransferConfig, device: torch.device):
        self.cfg = cfg
        self.workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")

    def plan(self, qo_indptr_cpu, kv_indptr_cpu, kv_indices: torch.Tensor, last_page_len_cpu) -> None:
        c = self.cfg
        self.wrapper.plan(
            qo_indptr_cpu, kv_indptr_cpu, kv_indices, last_page_len_cpu,
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=True,
        )

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(q, kv_cache)
