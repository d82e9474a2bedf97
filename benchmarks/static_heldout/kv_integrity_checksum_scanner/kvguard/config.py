from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple


@dataclass
class IntegrityConfig:
    num_layers: int = 32
    hidden: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = 16
    num_pages: int = 32768
    spare_pages: int = 256
    max_batch: int = 128
    buckets: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64, 128))
    scan_every: int = 64
    pages_per_scan: int = 2048
    device_compare: bool = False
    shadow_verify: bool = False
    use_trtllm_eager: bool = True

    @property
    def max_pages_per_step(self) -> int:
        return min(self.num_pages, self.max_batch * 512)

    def graph_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * self.head_dim * 64 + (32 << 20)

    def eager_workspace_bytes(self) -> int:
        return 4 * self.max_batch * self.num_qo_heads * self.head_dim * 64 + (64 << 20)
