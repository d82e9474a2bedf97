from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class TPServeConfig:
    tp_size: int = 4
    vocab_size: int = 151936
    hidden_size: int = 5120
    num_layers: int = 48
    num_qo_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch_size: int = 512
    max_pages: int = 65536
    max_context_len: int = 32768
    long_context_threshold: int = 16384
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    shared_prefix_pages: int = 64
    dtype: torch.dtype = torch.bfloat16

    @property
    def local_qo_heads(self) -> int:
        return self.num_qo_heads // self.tp_size

    @property
    def local_kv_heads(self) -> int:
        return max(1, self.num_kv_heads // self.tp_size)

    def eager_workspace_bytes(self) -> int:
        chunks = max(1, self.max_context_len // 512)
        return self.max_batch_size * self.local_qo_heads * chunks * (self.head_dim + 1) * 4 + (8 << 20)

    def long_workspace_bytes(self) -> int:
        return self.max_batch_size * self.local_qo_heads * (self.max_context_len // 256) * 4 + (16 << 20)
