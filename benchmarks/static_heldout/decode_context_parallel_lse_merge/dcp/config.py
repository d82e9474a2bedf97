from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


@dataclass
class DCPConfig:
    dcp_size: int = 4
    interleave: int = 1
    hidden_size: int = 5120
    vocab_size: int = 152064
    num_layers: int = 48
    num_local_heads: int = 8          # query heads this TP rank owns
    num_kv_heads: int = 1             # kv heads per rank (replicated across the DCP group)
    head_dim: int = 128
    page_size: int = 64
    num_local_pages: int = 32768      # pages of this rank's shard pool
    max_reqs: int = 512
    max_local_pages_per_seq: int = 1024
    max_bs: int = 128
    num_spec_tokens: int = 0
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 96, 128)
    sm_version: int = 90
    enable_graphs: bool = True

    @property
    def num_gathered_heads(self) -> int:
        return self.num_local_heads * self.dcp_size

    @property
    def q_len(self) -> int:
        return 1 + self.num_spec_tokens

    def max_decode_tokens(self) -> int:
        return self.max_bs * self.q_len

    def decode_workspace_bytes(self) -> int:
        # partial outputs of up to 32 kv chunks per (token, gathered head), fp32 + lse
        rows = self.max_decode_tokens() * self.num_gathered_heads
        return max(rows * 32 * (self.head_dim + 1) * 4, 32 << 20)

    def verify_workspace_bytes(self) -> int:
        rows = self.max_decode_tokens() * self.num_gathered_heads
        return max(rows * 16 * (self.head_dim + 1) * 4, 64 << 20)
