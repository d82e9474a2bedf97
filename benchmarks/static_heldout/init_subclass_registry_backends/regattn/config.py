"""Serving configuration and workspace sizes."""

from __future__ import annotations

import enum
from dataclasses import dataclass

PAGE_SIZE = 16
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
assert all(b <= 128 for b in GRAPH_BUCKETS), "trtllm-gen graphs are limited to 128 rows"  # ok: FC109
DRAFT_WORKSPACE_BYTES = 96 * 1024 * 1024  # sized on the 128-row MTP benchmark
_WS_MB = {"ragged": 256}


class WsTier(enum.IntEnum):
    SMALL = 64 << 20
    LARGE = 512 << 20


@dataclass(frozen=True)
class ServeConfig:
    backend: str = "flashinfer"
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    max_batch: int = 256
    max_seq_len: int = 32768
    max_num_tokens: int = 8192
    graph_buckets: tuple[int, ...] = GRAPH_BUCKETS
    layer_kinds: tuple[str, ...] = ("full", "softcap", "full", "mtp")
    window_size: int = 4096
    logits_soft_cap: float = 30.0
    prefill_workspace_bytes: int = 384 * 1024 * 1024

    @property
    def pages_per_req(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self) -> int:
        splits = max(1, self.max_seq_len // 2048)
        return (8 << 20) + self.max_batch * splits * self.num_qo_heads * (self.head_dim + 1) * 4
