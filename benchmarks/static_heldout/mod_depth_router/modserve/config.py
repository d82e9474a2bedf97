"""Configuration of the mixture-of-depths engine."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List

# Ragged prefill planner scratch; prompts are chunked before they reach the planner.
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class MoDConfig:
    num_layers: int = 32
    routed_every: int = 2           # every second block is a mixture-of-depths block
    capacity_ratio: float = 0.125   # fraction of the tokens a routed block processes
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 32000
    page_size: int = 16
    max_batch: int = 256
    max_seq_len: int = 8192
    max_num_tokens: int = 8192
    graph_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    eos_token_id: int = 2
    use_trtllm_decode: bool = False
    router_threshold: float = 0.0

    def is_routed(self, layer_id: int) -> bool:
        return layer_id % self.routed_every == self.routed_every - 1

    def capacity(self, num_tokens: int) -> int:
        return max(1, math.ceil(self.capacity_ratio * num_tokens))

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs: one fp32 row per (request, head, chunk) plus its lse
        chunks = max(1, self.max_seq_len // 512)
        return self.max_batch * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (16 << 20)

    def graph_bucket(self, bs: int) -> int:
        for b in self.graph_batch_sizes:
            if b >= bs:
                return b
        return -1
