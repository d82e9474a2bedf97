from __future__ import annotations

import dataclasses
from typing import Tuple

import torch


@dataclasses.dataclass
class ServeSettings:
    num_layers: int = 32
    hidden_size: int = 4096
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 262144
    max_rows: int = 256
    max_batch: int = 64
    max_num_tokens: int = 16384
    chunk_size: int = 8192
    max_pages_per_req: int = 8192
    rope_base: float = 10000.0
    original_max_position: int = 8192
    initial_rope_len: int = 16384
    far_split: int = 32768  # yarn band: pages older than this decode in a separate far pass
    fused_rope: bool = True
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    dtype: torch.dtype = torch.bfloat16

    def decode_workspace_bytes(self) -> int:
        # two split-k chunks of fp32 partial outputs and lse for every decode row and head
        return 2 * self.max_batch * 64 * self.num_q_heads * (self.head_dim + 1) * 4 + (8 << 20)

    def long_workspace_bytes(self) -> int:
        return self.max_batch * self.num_q_heads * self.head_dim * 4 * 16 + (4 << 20)

    def context_workspace_bytes(self) -> int:
        return self.chunk_size * self.num_q_heads * (self.head_dim + 1) * 4 + (4 << 20)
