"""Engine limits of the expert-parallel server (DeepSeek-style MLA attention, routed experts)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Tuple

# FlashInfer ragged-prefill workspace; overridable for debugging on small cards.
FI_PREFILL_WORKSPACE_BYTES = int(os.environ.get("EPSERVE_FI_WORKSPACE_BYTES", 512 << 20))


@dataclass
class EPConfig:
    hidden_size: int = 7168
    num_layers: int = 61
    first_dense_layers: int = 3
    num_heads: int = 16                 # per attention-TP rank
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    page_size: int = 64
    vocab_size: int = 129280
    num_experts: int = 256
    top_k: int = 8
    moe_intermediate: int = 2048
    capacity_factor: float = 1.25
    ep_size: int = 8
    max_batch_size: int = 256
    max_seq_len: int = 32768
    max_prefill_tokens: int = 8192
    graph_buckets: Tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    num_micro_batches: int = 2
    tbo_min_batch: int = 64
    long_row_threshold: int = 16384
    use_trtllm_tbo: bool = False

    @property
    def head_dim_qk(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def max_pages(self) -> int:
        return self.max_batch_size * math.ceil(self.max_seq_len / self.page_size)

    def mla_workspace_bytes(self, batch: int) -> int:
        # split-kv partial outputs: rows x heads x (ckv dim + lse), fp32, at most 8 splits
        return max(32 << 20, batch * self.num_heads * (self.kv_lora_rank + 1) * 4 * 8)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_heads * (self.kv_lora_rank + 2) * 4 * 16

    def scratch_bytes(self) -> int:
        return self.max_prefill_tokens * self.top_k * self.hidden_size * 2
