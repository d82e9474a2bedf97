from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class ReasoningConfig:
    num_layers: int = 28
    hidden_size: int = 3584
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 152064
    page_size: int = 16
    max_pages: int = 65536
    max_running: int = 256
    max_num_tokens: int = 8192
    think_start_token: int = 151667
    think_end_token: int = 151668
    default_budget: int = 4096
    probe_end_of_thinking: bool = False
    buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])

    @property
    def largest_bucket(self) -> int:
        return self.buckets[-1]

    def prefill_ws_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 + (8 << 20)

    def eager_ws_bytes(self) -> int:
        return self.max_running * self.num_qo_heads * (self.head_dim + 1) * 4 * 32
