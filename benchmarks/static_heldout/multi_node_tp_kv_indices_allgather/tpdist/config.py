from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class TPConfig:
    world_size: int = 16
    nodes: int = 2
    rank: int = 0
    local_rank: int = 0
    num_layers: int = 80
    hidden_size: int = 8192
    num_qo_heads: int = 64
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = 16
    max_pages: int = 131072
    max_batch: int = 512
    max_num_tokens: int = 16384
    buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    blocking_comm: bool = False

    @property
    def heads_per_rank(self) -> int:
        return self.num_qo_heads // self.world_size

    @property
    def kv_heads_per_rank(self) -> int:
        return max(1, self.num_kv_heads // self.world_size)

    @property
    def largest_bucket(self) -> int:
        return self.buckets[-1]

    def graph_ws_bytes(self) -> int:
        return self.largest_bucket * self.heads_per_rank * (self.head_dim + 1) * 4 * 64 + (4 << 20)

    def overflow_ws_bytes(self) -> int:
        return self.max_batch * self.heads_per_rank * (self.head_dim + 1) * 4 * 64 + (4 << 20)
