from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

# The draft model is small and decode-only; its workspace was picked once.
DRAFT_WORKSPACE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class SplitConfig:
    draft_device: str = "cuda:0"
    target_device: str = "cuda:1"
    draft_layers: int = 4
    target_layers: int = 40
    draft_hidden: int = 2048
    target_hidden: int = 5120
    num_qo_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 152064
    page_size: int = 16
    num_pages: int = 16384
    max_batch: int = 64
    max_model_len: int = 32768
    num_draft_tokens: int = 4
    buckets: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64))

    @property
    def max_pages_per_step(self) -> int:
        return self.max_batch * (self.max_model_len // self.page_size)

    def target_workspace_bytes(self) -> int:
        rows = self.max_batch * (self.num_draft_tokens + 1)
        return rows * self.num_qo_heads * self.head_dim * 4 * 16 + (32 << 20)

    def verify_eager_workspace_bytes(self) -> int:
        return 2 * self.target_workspace_bytes()
