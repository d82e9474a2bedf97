"""Engine limits and per-request sampling parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple


@dataclass
class NBestConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = 16
    num_pages: int = 65536
    max_groups: int = 64
    max_n: int = 16
    max_num_seqs: int = 512
    max_prompt_len: int = 8192
    max_new_tokens: int = 2048
    max_prefill_tokens: int = 16384
    graph_bs: Tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    eos_token_id: int = 128009
    sm_version: int = 90

    @property
    def max_pages_per_seq(self) -> int:
        return math.ceil((self.max_prompt_len + self.max_new_tokens) / self.page_size)


@dataclass
class SamplingParams:
    n: int = 4
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95
    max_new_tokens: int = 512
    length_penalty: float = 1.0
