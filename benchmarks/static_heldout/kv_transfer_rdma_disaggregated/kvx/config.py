"""Limits shared by the prefill and the decode node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

PAGE_ALIGN = 4096
# decode graphs share one workspace; sized once on the 2k-context launch benchmark
GRAPH_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class TransferConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    window: int = 4096  # odd layers use sliding-window attention
    max_batch: int = 256
    max_pages: int = 131072
    max_pages_per_req: int = 8192
    max_pages_per_transfer: int = 4096
    max_context: int = 131072
    num_slots: int = 64
    transfer_timeout_s: float = 5.0
    flags_in_device_memory: bool = True  # GPUDirect: the NIC writes completion flags into GPU memory
    prefill_workspace_bytes: int = 384 << 20
    buckets: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64, 128, 256))

    @property
    def page_numel(self) -> int:
        return self.num_layers * 2 * self.page_size * self.num_kv_heads * self.head_dim

    @property
    def page_bytes(self) -> int:
        return self.page_numel * 2

    def bucket_for(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)
