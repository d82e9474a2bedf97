from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Tuple

import torch


class WsTier(enum.Enum):
    """Workspace sizes in MiB, as measured on the reference deployment."""

    DECODE = 160
    JUMP = 64

    def nbytes(self) -> int:
        return self.value << 20


@dataclass
class GBConfig:
    num_layers: int = 28
    hidden_size: int = 3584
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 151936
    page_size: int = 16
    num_pages: int = 65536
    max_batch_size: int = 128
    max_prefill_tokens: int = 16384
    max_jump_tokens: int = 16
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    jump_buckets: Tuple[int, ...] = (1, 4, 16)
    kv_layout: str = "NHD"
    use_trtllm: bool = False  # Blackwell: trtllm-gen context and decode kernels
    dtype: torch.dtype = torch.bfloat16

    @property
    def bitmask_words(self) -> int:
        return (self.vocab_size + 31) // 32

    def _partials(self, rows: int) -> int:
        return rows * self.num_qo_heads * (self.head_dim + 1) * 4

    def prefill_workspace_bytes(self) -> int:
        return 2 * self._partials(self.max_prefill_tokens) + (16 << 20)

    def decode_workspace_bytes(self) -> int:
        return 16 * self._partials(self.max_batch_size) + (8 << 20)
