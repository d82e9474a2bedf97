"""Language-model side configuration of the vision-language server."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class VLConfig:
    hidden_size: int = 3584
    num_layers: int = 28
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    intermediate_size: int = 18944
    vocab_size: int = 152064
    page_size: int = 16
    num_pages: int = 65536
    max_cached_images: int = 4096
    max_batch: int = 128
    max_num_tokens: int = 16384
    max_model_len: int = 32768
    long_context_threshold: int = 16384
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    rope_theta: float = 1000000.0
    dtype: torch.dtype = torch.bfloat16

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def decode_ws_bytes(self) -> int:
        chunks = max(1, self.max_model_len // 2048)
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * chunks + (16 << 20)

    def long_ws_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * 16384 + (64 << 20)
