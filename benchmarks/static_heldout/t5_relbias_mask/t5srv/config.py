"""Model shape and serving limits."""
from __future__ import annotations

import dataclasses
import enum
from typing import Tuple


class WsSize(enum.IntEnum):
    """Float workspace of the encoder prefill wrapper."""

    ENCODER = 256 * 1024 * 1024


@dataclasses.dataclass
class T5Config:
    d_model: int = 1024
    d_kv: int = 64
    d_ff: int = 2816
    num_heads: int = 16
    num_layers: int = 24
    num_decoder_layers: int = 24
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    vocab_size: int = 32128
    layer_norm_epsilon: float = 1e-6


@dataclasses.dataclass
class ServeLimits:
    max_batch: int = 64
    max_encoder_len: int = 1024
    max_decoder_len: int = 512
    page_size: int = 16
    num_self_pages: int = 32768
    num_cross_pages: int = 65536
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    cross_backend: str = "flashinfer"  # or "trtllm-gen": cross-attention through trtllm_batch_decode_with_kv_cache
