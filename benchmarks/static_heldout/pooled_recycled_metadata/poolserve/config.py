"""Serving limits and workspace sizes."""

from __future__ import annotations

import dataclasses
import os
from typing import Tuple

GRAPH_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
assert GRAPH_BUCKETS[0] == 1, "bucket 1 serves single-request decode"  # ok: FC109

GROUP_WORKSPACE_BYTES = 64 * 1024 * 1024
DRAFT_EXTEND_WORKSPACE_BYTES = int(os.getenv("POOLSERVE_DRAFT_EXTEND_WS_MB", "128")) << 20
WS_MIB = {"swa": 96, "cascade": 160}


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_layers: int = 32
    swa_every: int = 0  # every n-th layer uses the sliding window; 0 disables it
    sliding_window: int = 4096
    max_batch_size: int = 64
    max_pages: int = 1 << 18
    max_num_tokens: int = 8192
    num_draft_tokens: int = 0
    decode_backend: str = "fa2"
    eos_token_id: int = 2
    group_wrappers: int = 4
    staging_depth: int = 3
    graph_buckets: Tuple[int, ...] = GRAPH_BUCKETS
    prefill_workspace_bytes: int = 256 << 20

    def plan_dims(self) -> Tuple[int, int, int, int]:
        return (self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)

    def is_swa_layer(self, i: int) -> bool:
        return self.swa_every > 0 and i % self.swa_every == self.swa_every - 1

    def split_kv_workspace_bytes(self) -> int:
        rows = max(self.max_num_tokens, self.max_batch_size * (1 + self.num_draft_tokens))
        return rows * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (32 << 20)
