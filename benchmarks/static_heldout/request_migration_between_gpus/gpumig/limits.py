"""Per-GPU engine limits."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Tuple

# eager decode workspace; operators raise it for very long contexts
DECODE_WS_BYTES = int(os.environ.get("MIG_DECODE_WS_BYTES", 256 * 1024 * 1024))


@dataclass(frozen=True)
class MigrationLimits:
    num_layers: int = 40
    hidden_size: int = 5120
    num_qo_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 100352
    page_size: int = 16
    num_pages: int = 98304
    max_batch: int = 192
    max_pages_per_req: int = 2048
    max_prefill_tokens: int = 8192
    pages_per_copy_chunk: int = 256
    use_trtllm: bool = False
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 96)

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    def graph_workspace_bytes(self) -> int:
        splits = max(1, self.max_pages_per_req * self.page_size // 4096)
        return self.max_graph_bs * self.num_qo_heads * splits * (self.head_dim + 1) * 4 + (8 << 20)

    def peer_workspace_bytes(self) -> int:
        return self.graph_workspace_bytes()

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 + (16 << 20)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.head_dim + 2) * 4 * 16
