from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .constants import DECODE_BUCKETS, PAGE_SIZE


@dataclass
class EngineConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 32000
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = PAGE_SIZE
    num_pages: int = 65536
    max_pages_per_seq: int = 1024
    max_prefill_tokens: int = 16384
    max_prefill_reqs: int = 16
    long_context_threshold: int = 32768
    decode_buckets: Tuple[int, ...] = DECODE_BUCKETS
    prefix_ws_bytes: int = 64 << 20
    use_cuda_graph: bool = True
    decode_stream_priority: int = -1
