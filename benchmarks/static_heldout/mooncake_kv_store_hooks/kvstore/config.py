"""Store and engine configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

# decode graphs share one float workspace; sized on the launch benchmark
DECODE_WORKSPACE_BYTES = 192 * 1024 * 1024


@dataclass
class StoreConfig:
    store_url: str = "mooncake://127.0.0.1:50051"
    protocol: str = "rdma"
    model_id: str = "llama-3.1-8b"
    page_size: int = 16
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 128256
    max_batch: int = 128
    max_pages_per_seq: int = 1024
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    prefill_workspace_bytes: int = 256 << 20
    max_load_pages: int = 4096
    max_inflight_puts: int = 64
    min_hit_pages: int = 2
    trtllm_min_seq_len: int = 8192
    max_pad_rows: int = 24
