"""Model and engine configuration."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .constants import DEFAULT_BUCKETS, HEAD_DIM, PAGE_SIZE


@dataclass
class ModelConfig:
    num_layers: int = 24
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = HEAD_DIM
    hidden_size: int = 4096
    vocab_size: int = 128256
    page_size: int = PAGE_SIZE
    max_batch: int = 64
    max_pages_per_seq: int = 512
    max_prefill_tokens: int = 8192
    num_kv_pages: int = 32768
    # A config string looked up in ubr_backends.registry.BACKENDS.
    backend: str = "fi_paged"
    workspace_bytes: int = 128 << 20
    capture_buckets: Tuple[int, ...] = DEFAULT_BUCKETS


def workspace_bytes_for(cfg: ModelConfig) -> int:
    """Split-k scratch for the largest step the engine admits, with headroom."""
    rows = max(cfg.max_batch, cfg.max_prefill_tokens)
    per_row = cfg.num_qo_heads * (cfg.head_dim + 1) * 4
    return 2 * rows * per_row * 8 + (16 << 20)
