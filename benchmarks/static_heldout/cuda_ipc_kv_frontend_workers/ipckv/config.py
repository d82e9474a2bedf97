from dataclasses import dataclass
from typing import Tuple


@dataclass
class IpcServeConfig:
    vocab_size: int = 151936
    hidden: int = 3584
    num_layers: int = 28
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 256
    max_num_tokens: int = 16384
    max_pages: int = 262144
    max_pages_per_seq: int = 4096
    long_ctx_len: int = 65536
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    eager_workspace_bytes: int = 256 * 1024 * 1024
    trtllm_decode_ws_bytes: int = 128 * 1024 * 1024
    trtllm_ctx_ws_bytes: int = 256 * 1024 * 1024
