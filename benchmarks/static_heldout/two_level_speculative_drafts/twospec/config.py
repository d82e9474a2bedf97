"""Limits of the two-level speculative server."""

from dataclasses import dataclass
from typing import Tuple


@dataclass
class SpecConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    draft_hidden: int = 1024
    draft_layers: int = 2
    draft_qo_heads: int = 16
    draft_kv_heads: int = 4
    draft_head_dim: int = 64
    page_size: int = 16
    target_pages: int = 65536
    draft_pages: int = 16384
    max_batch_size: int = 32
    max_context: int = 16384
    ngram_n: int = 3
    ngram_max_proposals: int = 4
    draft_depth: int = 4
    tree_width: int = 4
    max_tree_nodes: int = 32
    draft_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    device: str = "cuda"

    def max_pages_per_seq(self) -> int:
        return (self.max_context + self.max_tree_nodes + self.page_size - 1) // self.page_size

    def max_tree_depth(self) -> int:
        return max(self.ngram_max_proposals, self.draft_depth)

    def verify_tokens(self) -> int:
        return self.max_batch_size * self.max_tree_nodes

    def verify_workspace_bytes(self) -> int:
        return self.verify_tokens() * self.num_qo_heads * (self.head_dim + 1) * 4 * 4 + (16 << 20)

    def draft_eager_workspace_bytes(self) -> int:
        return self.max_batch_size * self.draft_qo_heads * (self.draft_head_dim + 1) * 4 * 16 + (8 << 20)

    def nodraft_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * self.head_dim * 4 * 16 + (8 << 20)

    def mask_bytes(self) -> int:
        per_row = self.max_tree_nodes * (self.max_context + self.max_tree_nodes)
        return self.max_batch_size * ((per_row + 7) // 8)
