from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

# eager decode workspace: small deployments and large DP groups
EAGER_WS_TIERS = (128 * 1024 * 1024, 384 * 1024 * 1024)


@dataclass
class DPConfig:
    dp_size: int = 8
    dp_rank: int = 0
    num_experts: int = 64
    top_k: int = 6
    hidden_size: int = 4096
    intermediate_size: int = 1408
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 64
    num_pages: int = 16384
    num_layers: int = 8
    vocab_size: int = 102400
    max_tokens_per_rank: int = 4096
    max_pages_per_seq: int = 512
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    global_buckets: Tuple[int, ...] = (8, 32, 128, 512)

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.dp_size

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    @property
    def decode_workspace_bytes(self) -> int:
        return self.max_graph_bs * self.num_qo_heads * (self.head_dim + 2) * 4 * 32

    def prefill_workspace_bytes(self) -> int:
        return self.max_tokens_per_rank * self.num_qo_heads * (self.head_dim + 2) * 4 * 2

    def bucket_for(self, n: int) -> int:
        return next((b for b in self.graph_buckets if b >= n), -1)

    def global_bucket(self, max_tokens: int) -> int:
        return next((b for b in self.global_buckets if b >= max_tokens), -1)
