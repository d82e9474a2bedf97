from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class TraceEngineConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = 16
    max_pages: int = 65536
    max_running: int = 256
    max_pages_per_seq: int = 4096
    max_num_tokens: int = 8192
    buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
    eager_workspace_bytes: int = 64 * 1024 * 1024
    profile_every_n: int = 100
    stats_flush_every: int = 50
    max_stat_slots: int = 16
    shadow_attention: bool = False
    poison_unused_pages: bool = False
    poison_every: int = 10

    @property
    def largest_bucket(self) -> int:
        return self.buckets[-1]

    def prefill_ws_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 + (8 << 20)

    def trt_ws_bytes(self) -> int:
        return self.max_running * self.num_qo_heads * (self.head_dim + 1) * 4 * 16
