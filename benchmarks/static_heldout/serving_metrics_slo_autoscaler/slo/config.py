from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class SLOConfig:
    ttft_ms: float = 500.0
    tpot_ms: float = 40.0
    num_layers: int = 24
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab: int = 32000
    page_size: int = 32
    num_pages: int = 65536
    max_batch: int = 256
    max_pages_per_seq: int = 512
    initial_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    candidate_buckets: Tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    max_graphs: int = 10
    rescale_every: int = 2000
    dtype: torch.dtype = torch.float16

    @property
    def hidden(self) -> int:
        return self.num_qo_heads * self.head_dim

    def graph_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * 16 * (self.head_dim + 1) * 4 + (16 << 20)

    def eager_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * 32 * (self.head_dim + 1) * 4 + (16 << 20)
