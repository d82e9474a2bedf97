from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class SpecConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 32000
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch_size: int = 64
    max_context_len: int = 16384
    batch_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    tree_sizes: Tuple[int, ...] = (8, 16, 32, 64)
    dtype: torch.dtype = torch.float16

    @property
    def pages_per_request(self) -> int:
        return -(-self.max_context_len // self.page_size)

    @property
    def max_tree_tokens(self) -> int:
        return self.max_batch_size * max(self.tree_sizes)

    def mask_bytes(self) -> int:
        # one bit per (tree node, visible token) pair, per request, byte-aligned
        return self.max_batch_size * (max(self.tree_sizes) * (self.max_context_len + max(self.tree_sizes)) // 8 + 1)

    def eager_workspace_bytes(self) -> int:
        return self.max_tree_tokens * self.num_heads * (self.head_dim + 1) * 4 * 4 + (16 << 20)

    def draft_workspace_bytes(self) -> int:
        splits = max(1, self.max_context_len // 1024)
        return self.max_batch_size * self.num_heads * (self.head_dim + 1) * 4 * splits + (8 << 20)
