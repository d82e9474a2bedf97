"""Limits of the elastic engine."""

from __future__ import annotations

import dataclasses
import enum
from typing import Tuple


class WorkspaceSize(enum.Enum):
    GRAPH = 192
    PREFILL = 384

    def nbytes(self) -> int:
        return self.value * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    num_layers: int = 4
    hidden_size: int = 2048
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    initial_pages: int = 16384
    min_pages: int = 4096
    max_pages: int = 131072
    grow_granularity: int = 4096
    max_batch: int = 128
    max_pages_per_req: int = 512
    max_prefill_tokens: int = 8192
    max_context: int = 8192
    vocab_size: int = 32000
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    grow_watermark: float = 0.9
    shrink_watermark: float = 0.3

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * self.head_dim * 4 * 2 + (8 << 20)

    def decode_workspace_bytes(self) -> int:
        chunks = max(1, self.max_context // 512)
        return self.max_batch * self.num_qo_heads * self.head_dim * 4 * chunks + (8 << 20)

    def eager_workspace_bytes(self) -> int:
        # trtllm-gen: partials for the widest eager batch (2x the largest bucket)
        return 2 * self.decode_workspace_bytes()
