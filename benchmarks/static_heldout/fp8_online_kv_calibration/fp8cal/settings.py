from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class CalibSettings:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch_size: int = 256
    max_pages: int = 131072
    max_context_len: int = 32768
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    # layers profiled offline as having K/V outliers: kept in bf16 pages
    bf16_layers: Tuple[int, ...] = (0, 31)
    calib_steps: int = 64
    amax_margin: float = 1.25
    drift_check_every: int = 512
    fp8_max: float = 448.0
    requant_chunk_pages: int = 4096
    dtype: torch.dtype = torch.bfloat16

    def _split_k_bytes(self, rows: int) -> int:
        chunks = max(1, self.max_context_len // 512)
        return rows * self.num_qo_heads * chunks * (self.head_dim + 1) * 4

    def graph_workspace_bytes(self) -> int:
        return self._split_k_bytes(max(self.graph_buckets)) + (8 << 20)

    def eager_workspace_bytes(self) -> int:
        return self._split_k_bytes(self.max_batch_size) + (8 << 20)

    def bf16_workspace_bytes(self) -> int:
        return self._split_k_bytes(self.max_batch_size) + (8 << 20)

    def xqa_workspace_bytes(self) -> int:
        # semaphores + partial results per (row, kv head, split)
        return self.max_batch_size * self.num_kv_heads * 64 * (self.head_dim * 4 + 8) + (1 << 20)
