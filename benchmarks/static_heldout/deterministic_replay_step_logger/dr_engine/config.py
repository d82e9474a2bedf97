"""Engine configuration."""

from __future__ import annotations

import dataclasses
from typing import Tuple


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    num_layers: int = 4
    hidden_size: int = 2048
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 128
    max_pages_per_req: int = 256
    max_prefill_tokens: int = 8192
    vocab_size: int = 32000
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    # batch-invariant decode: one split per row, same kernel for every batch size
    deterministic: bool = False
    record_capacity: int = 256

    @property
    def max_pages(self) -> int:
        return self.max_batch * self.max_pages_per_req

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * self.head_dim * 4 * 2 + (8 << 20)

    def decode_workspace_bytes(self) -> int:
        splits = max(1, self.max_pages_per_req * self.page_size // 1024)
        return self.max_batch * self.num_qo_heads * self.head_dim * 4 * splits + (8 << 20)
