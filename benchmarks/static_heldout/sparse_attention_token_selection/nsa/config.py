"""Engine limits of the sparse (NSA/DSA-style) decode server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

# Eager sparse decode runs outside the bucketed graphs; the team sized its workspace on the
# 8k-context benchmark and never revisited it.
SPARSE_DECODE_WORKSPACE_BYTES = 192 * 1024 * 1024

DEFAULT_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class SparseConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    # lightning indexer
    index_heads: int = 4
    index_dim: int = 64
    # paging and selection
    page_size: int = 64
    top_k_pages: int = 32
    max_pages_per_req: int = 2048
    max_batch: int = 64
    max_prefill_tokens: int = 16384
    # the first layers keep dense attention over every page, as DSA checkpoints do
    num_dense_layers: int = 2
    buckets: Tuple[int, ...] = field(default_factory=lambda: DEFAULT_BUCKETS)

    @property
    def max_selected(self) -> int:
        return self.max_batch * self.top_k_pages

    @property
    def max_context(self) -> int:
        return self.max_pages_per_req * self.page_size

    def bucket_for(self, bs: int) -> int:
        for b in self.buckets:
            if b >= bs:
                return b
        raise ValueError(f"batch of {bs} exceeds the largest bucket {self.buckets[-1]}")
