from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass
class MLAConfig:
    num_heads: int = 128
    hidden_size: int = 7168
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    page_size: int = 64
    num_pages: int = 8192
    num_layers: int = 4
    vocab_size: int = 129280
    max_batch: int = 256
    max_pages_per_seq: int = 256
    max_prefill_tokens: int = 16384
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    decode_impl: str = "trtllm-gen"  # or "fa2" where trtllm-gen MLA is unavailable
    num_spec_tokens: int = 2  # MTP draft tokens verified per step

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    @property
    def softmax_scale(self) -> float:
        return (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5

    def bucket_for(self, n: int) -> int:
        return next((b for b in self.graph_buckets if b >= n), -1)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_heads * (self.kv_lora_rank + 2) * 4 * 8

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim) * 4
