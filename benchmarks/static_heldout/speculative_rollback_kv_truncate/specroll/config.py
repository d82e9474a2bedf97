"""Draft/target dimensions and engine limits."""

from __future__ import annotations

import dataclasses
from typing import Tuple

# Draft-graph workspace by context class. The draft model is small and its
# batch is capped by the buckets, so a fixed size was thought to be enough.
_WS_BYTES = {
    "draft": lambda: 64 * 1024 * 1024,
    "draft_long": lambda: 128 * 1024 * 1024,
}


@dataclasses.dataclass
class ModelDims:
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    hidden: int


@dataclasses.dataclass
class SpecConfig:
    draft: ModelDims = dataclasses.field(default_factory=lambda: ModelDims(2, 16, 4, 64, 1024))
    target: ModelDims = dataclasses.field(default_factory=lambda: ModelDims(8, 32, 8, 128, 4096))
    num_draft_tokens: int = 4
    page_size: int = 16
    num_pages: int = 65536
    max_batch: int = 64
    max_pages_per_req: int = 256
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    vocab_size: int = 32000
    # operators size the target graph workspace per deployment
    target_workspace_bytes: int = 256 * 1024 * 1024

    @property
    def max_context(self) -> int:
        return self.max_pages_per_req * self.page_size

    def verify_tokens(self, bs: int) -> int:
        return bs * (self.num_draft_tokens + 1)

    def verify_workspace_bytes(self) -> int:
        tokens = self.verify_tokens(self.max_batch)
        return tokens * self.target.num_qo_heads * self.target.head_dim * 4 * 8 + (16 << 20)

    def extend_workspace_bytes(self) -> int:
        tokens = self.verify_tokens(self.max_batch)
        return tokens * self.draft.num_qo_heads * self.draft.head_dim * 4 * 4 + (4 << 20)
