"""Configuration of the double-buffered decode engine."""

from __future__ import annotations

import dataclasses
from typing import Tuple

# Decode-graph workspace tiers in bytes: the small tier for models with at most
# 16 query heads, the large one for everything else.
GRAPH_WS_TIERS = (64 * 1024 * 1024, 256 * 1024 * 1024)


@dataclasses.dataclass(frozen=True)
class DoubleBufferConfig:
    num_layers: int = 4
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 256
    max_pages_per_req: int = 512
    max_prefill_tokens: int = 8192
    vocab_size: int = 32000
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    long_row_threshold: int = 4096
    max_context: int = 8192
    # Reserve the long-row path inside captured buckets (for long-context
    # deployments where most rows pass the threshold).
    capture_long_rows: bool = False

    @property
    def max_pages(self) -> int:
        return self.max_batch * self.max_pages_per_req

    @property
    def group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    def prefill_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32) for every prefill token, plus the int part
        partials = self.max_prefill_tokens * self.num_qo_heads * self.head_dim * 4 * 2
        return partials + (8 << 20)

    def decode_workspace_bytes(self) -> int:
        chunks = max(1, self.max_context // 512)
        return self.max_batch * self.num_qo_heads * self.head_dim * 4 * chunks + (8 << 20)

    def graph_tier(self) -> int:
        return 1 if self.num_qo_heads > 16 else 0
