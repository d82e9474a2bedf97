"""Settings of the desktop engine."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List

# FlashInfer scratch; the desktop build lets users shrink it on 8 GB cards.
WORKSPACE_BYTES = int(os.environ.get("DESKLM_WORKSPACE_MB", "64")) << 20


@dataclass
class DeskSettings:
    vocab_size: int = 128256
    hidden_size: int = 3072
    num_layers: int = 28
    num_qo_heads: int = 24
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 64
    local_window: int = 1024
    local_every: int = 2
    max_context: int = 32768
    bucket_lengths: List[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    use_trtllm_gen: bool = False

    @property
    def max_pages(self) -> int:
        return self.max_context // self.page_size

    def is_local(self, layer_id: int) -> bool:
        return layer_id % self.local_every == 0

    def gen_workspace_bytes(self) -> int:
        # trtllm-gen keeps one counter block per (head, CTA); sized from the longest context
        return self.num_qo_heads * (self.max_context // 256) * 1024 + (4 << 20)
