"""Engine configuration; workspace sizes derive from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class GraphConfig:
    max_bs: int = 160
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160)
    verify_len: int = 4  # draft tokens + 1 per request in a verify step
    page_size: int = 16
    max_pages_per_seq: int = 512
    num_layers: int = 24
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    hidden: int = 2048
    vocab: int = 32000
    num_warmups: int = 2
    eager_max_bs: int = 512
    trtllm_min_seq_len: int = 6144
    dtype: torch.dtype = torch.bfloat16

    @property
    def max_tokens(self) -> int:
        return self.max_bs * self.verify_len

    def _per_row(self) -> int:
        return self.num_qo_heads * (self.head_dim + 1) * 4

    def eager_workspace_bytes(self) -> int:
        return self.eager_max_bs * self._per_row() * max(1, self.max_pages_per_seq // 32)

    def trtllm_workspace_bytes(self) -> int:
        return self.eager_max_bs * self._per_row() * 8 + self.eager_max_bs * self.num_qo_heads * 8

    def verify_workspace_bytes(self) -> int:
        return self.max_tokens * self._per_row() * 4 + (4 << 20)
