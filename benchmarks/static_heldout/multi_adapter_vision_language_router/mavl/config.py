"""Server limits and adapter specs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

# The vision towers' ragged attention shares one workspace; the size was picked for 448px tiles.
vision_ws_bytes = lambda: 96 << 20  # noqa: E731


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    kind: str  # "vision" or "lora"
    rank: int = 16
    alpha: float = 32.0
    patch_dim: int = 3 * 14 * 14
    vision_hidden: int = 1024
    vision_heads: int = 16
    merge: int = 4  # patches merged into one LM token


@dataclass
class RouterConfig:
    num_layers: int = 28
    hidden_size: int = 3584
    vocab_size: int = 152064
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    cross_every: int = 4  # every 4th layer cross-attends to the image tokens
    max_image_tokens: int = 4096
    max_adapters: int = 16
    max_rank: int = 64
    max_batch: int = 128
    max_pages: int = 65536
    max_prompt_tokens: int = 32768
    prompt_workspace_bytes: int = 512 << 20
    buckets: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64, 128))

    def bucket_for(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)
