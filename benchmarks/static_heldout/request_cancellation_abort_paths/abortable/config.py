from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

PAD_PAGE = 0  # never handed out: dead and padding rows point at it
PAD_SLOT = 0  # KV slot that padding rows write into (inside PAD_PAGE)


@dataclass
class EngineConfig:
    num_layers: int = 24
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    hidden_size: int = 2048
    vocab_size: int = 128256
    page_size: int = 16
    num_pages: int = 32768
    max_running_requests: int = 256
    max_pages_per_request: int = 512
    max_prefill_tokens: int = 8192
    max_kv_splits: int = 16
    prefill_workspace_bytes: int = 384 << 20
    eos_token_id: int = 2
    graph_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
