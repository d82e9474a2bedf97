from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .constants import EXPORT_EVERY, PAGE_SIZE


@dataclass
class MoEConfig:
    num_layers: int = 24
    hidden_size: int = 2880
    vocab_size: int = 201088
    num_experts: int = 32
    top_k: int = 4
    moe_intermediate: int = 2880
    ep_size: int = 4
    num_qo_heads: int = 64
    num_kv_heads: int = 8
    head_dim: int = 64
    page_size: int = PAGE_SIZE
    num_pages: int = 32768
    max_pages_per_seq: int = 512
    max_prefill_tokens: int = 8192
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    export_every: int = EXPORT_EVERY
    capacity_factor: float = 2.0
    mtp: bool = True
