from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import List


class WsSize(IntEnum):
    DECODE = 128 << 20
    PREFILL = 256 << 20


@dataclass
class EngineConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 32
    head_dim: int = 96
    page_size: int = 16
    vocab_size: int = 32064
    original_max: int = 4096
    max_position: int = 131072
    rope_base: float = 10000.0
    max_bs: int = 64
    max_pages_per_req: int = 8192
    max_recompute_tokens: int = 16384
    workspace_bytes: int = 256 << 20
    graph_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    sm_version: int = 90
