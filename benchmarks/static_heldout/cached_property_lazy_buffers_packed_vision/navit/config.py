"""Limits of the engine; every buffer is sized from these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

PATCH_SIZE = 14
MERGE_SIZE = 2
PAGE_SIZE = 16
IMAGE_TOKEN_ID = 151655
DECODE_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
VISION_WS_BYTES = 192 * 1024 * 1024


@dataclass
class VLMConfig:
    vision_depth: int = 32
    vision_heads: int = 16
    vision_head_dim: int = 80
    window_size: int = 112  # pixels per side of a windowed-attention tile
    fullatt_blocks: Tuple[int, ...] = (7, 15, 23, 31)
    max_patches: int = 16384
    lm_layers: int = 28
    hidden: int = 3584
    vocab: int = 152064
    num_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    max_window_layers: int = 28  # layers at or past this index use the sliding window
    sliding_window: int = 4096
    max_batch_size: int = 32
    max_context_len: int = 32768
    num_pages: int = 32768
    long_prompt_threshold: int = 16384
    use_trtllm_decode: bool = False
    decode_buckets: Tuple[int, ...] = field(default_factory=lambda: DECODE_BUCKETS)
    lm_workspace_bytes: int = 256 * 1024 * 1024

    @property
    def vision_hidden(self) -> int:
        return self.vision_heads * self.vision_head_dim

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_context_len + PAGE_SIZE - 1) // PAGE_SIZE

    def prefill_workspace_bytes(self) -> int:
        return max(self.max_patches * self.num_heads * self.head_dim * 4 * 4, 128 << 20)
