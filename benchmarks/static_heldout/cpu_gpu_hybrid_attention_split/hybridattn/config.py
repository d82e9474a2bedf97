from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class HybridConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 32000
    page_size: int = 16
    window: int = 4096               # most recent tokens whose KV stays on the GPU
    max_batch: int = 96
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48)
    gpu_pages: int = 32768
    host_pages: int = 1 << 20
    cpu_workers: int = 8
    max_prefill_tokens: int = 8192
    max_context: int = 1 << 20
    dtype: torch.dtype = torch.bfloat16

    @property
    def window_pages(self) -> int:
        return self.window // self.page_size

    @property
    def hidden(self) -> int:
        return self.num_qo_heads * self.head_dim

    def graph_workspace_bytes(self) -> int:
        per_row = self.num_qo_heads * (self.head_dim + 1) * 4
        return max(self.buckets) * 32 * per_row + (8 << 20)

    def overflow_workspace_bytes(self) -> int:
        per_row = self.num_qo_heads * (self.head_dim + 1) * 4
        return self.max_batch * 32 * per_row + (8 << 20)

    def context_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * self.head_dim * 8 + (64 << 20)
