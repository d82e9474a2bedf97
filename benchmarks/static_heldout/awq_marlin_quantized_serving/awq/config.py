"""Serving configuration for AWQ-quantized checkpoints on Marlin kernels."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

import torch

# The decode graphs share one workspace; sized when the kernels were first tuned on an A100.
DECODE_WORKSPACE_BYTES = 256 * 1024 * 1024

QuantKey = Tuple[str, int]


@dataclass(frozen=True)
class QuantLayerMeta:
    """Per-layer quantization metadata recorded by the loader."""

    name: str
    in_features: int
    out_features: int
    group_size: int
    zero_point: bool = True
    marlin_tile: Tuple[int, int] = (16, 256)

    @property
    def num_groups(self) -> int:
        return self.in_features // self.group_size


@dataclass
class AWQServeConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    intermediate_size: int = 11008
    vocab_size: int = 32000
    page_size: int = 16
    max_pages: int = 65536
    max_pages_per_seq: int = 2048
    max_num_tokens: int = 8192
    group_size: int = 128
    buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    eager_workspace_bytes: int = 128 * 1024 * 1024
    long_decode_threshold: int = 32768
    use_long_decode: bool = False
    kv_dtype: torch.dtype = torch.float16

    @property
    def largest_bucket(self) -> int:
        return self.buckets[-1]

    def prefill_workspace_bytes(self) -> int:
        # split-k partial outputs for every token of a full chunk, plus the planner's int section
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 + (8 << 20)

    def long_decode_workspace_bytes(self) -> int:
        return self.largest_bucket * self.num_qo_heads * (self.head_dim + 1) * 4 * 32
