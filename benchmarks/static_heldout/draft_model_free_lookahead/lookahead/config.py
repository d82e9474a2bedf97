from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

NGRAM_N = 3
MAX_DRAFT = 4
MAX_BRANCHES = 2


@dataclass
class LookaheadConfig:
    max_batch: int = 64
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_draft: int = MAX_DRAFT
    max_branches: int = MAX_BRANCHES
    ngram_n: int = NGRAM_N
    page_size: int = 16
    max_model_len: int = 8192
    num_pages: int = 32768
    num_layers: int = 8
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000

    @property
    def max_graph_bs(self) -> int:
        return self.graph_buckets[-1]

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_model_len // self.page_size)

    @property
    def max_query_per_row(self) -> int:
        return 1 + self.max_draft * self.max_branches

    def decode_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * 32 + (16 << 20)

    def graph_workspace_bytes(self) -> int:
        return self.max_graph_bs * self.num_qo_heads * (self.head_dim + 1) * 4 * 32 + (8 << 20)
