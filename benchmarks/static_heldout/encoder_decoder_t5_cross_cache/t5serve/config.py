from dataclasses import dataclass
from typing import Tuple

import torch

from .constants import MAX_DISTANCE, NUM_BUCKETS


@dataclass
class T5Config:
    num_encoder_layers: int = 12
    num_decoder_layers: int = 12
    d_model: int = 1024
    num_heads: int = 16
    head_dim: int = 64
    d_ff: int = 2816
    vocab: int = 32128
    page_size: int = 16
    self_pages: int = 65536
    cross_pages: int = 32768
    max_batch: int = 128
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    max_enc_len: int = 2048
    cross_cap_tokens: int = 1024       # longer encoder outputs take the eager long-cross path
    num_buckets: int = NUM_BUCKETS
    max_distance: int = MAX_DISTANCE
    dtype: torch.dtype = torch.bfloat16

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    def graph_workspace_bytes(self) -> int:
        return max(self.buckets) * self.num_heads * 32 * (self.head_dim + 1) * 4 + (16 << 20)

    def long_cross_workspace_bytes(self) -> int:
        return self.max_batch * self.num_heads * 64 * (self.head_dim + 1) * 4 + (16 << 20)
