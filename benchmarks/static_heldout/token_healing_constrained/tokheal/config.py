from __future__ import annotations

import dataclasses
import enum
from typing import Tuple

import torch


class WsTier(enum.IntEnum):
    """Workspace sizes of the first deployment (batch 32, 4k context)."""

    SMALL = 32 << 20
    GRAPH = 128 << 20
    LARGE = 512 << 20


@dataclasses.dataclass
class HealConfig:
    vocab_size: int = 128256
    num_layers: int = 28
    hidden_size: int = 3072
    num_q_heads: int = 24
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 32768
    max_rows: int = 256
    max_batch: int = 64
    max_num_tokens: int = 8192
    max_pages_per_req: int = 1024
    max_heal_tokens: int = 3
    spec_k: int = 3
    trtllm_ws_bytes: int = 64 << 20
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    dtype: torch.dtype = torch.bfloat16
