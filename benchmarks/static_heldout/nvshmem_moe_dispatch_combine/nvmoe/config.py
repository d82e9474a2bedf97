from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class MoEConfig:
    num_layers: int = 16
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 129280
    num_experts: int = 64
    top_k: int = 6
    moe_intermediate_size: int = 1408
    capacity_factor: float = 1.25
    world_size: int = 8
    page_size: int = 16
    num_pages: int = 32768
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_pages_per_seq: int = 256
    enable_cuda_graph: bool = True
    graph_buckets: List[int] = field(default_factory=lambda: [8, 16, 32, 64, 128, 256])
