from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple


@dataclass
class JsonModeConfig:
    num_layers: int = 28
    hidden: int = 3584
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 152064  # padded to a multiple of 32
    page_size: int = 16
    num_pages: int = 65536
    max_batch: int = 256
    buckets: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64, 128, 256))
    use_trtllm_eager: bool = True
    max_forced_tokens: int = 16

    @property
    def mask_words(self) -> int:
        return self.vocab_size // 32

    @property
    def max_pages_per_step(self) -> int:
        return min(self.num_pages, self.max_batch * 256)

    def graph_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * self.head_dim * 32 + (32 << 20)

    def eager_workspace_bytes(self) -> int:
        return 4 * self.graph_workspace_bytes()
