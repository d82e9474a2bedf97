from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class RazorConfig:
    num_layers: int = 28
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 152064
    page_size: int = 16
    retrieval_kv_heads: int = 1  # per layer, full KV
    dense_layers: int = 2  # the first layers keep every head's KV
    sink_pages: int = 1
    window_pages: int = 128
    max_batch_size: int = 128
    max_seq_len: int = 131072
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    trtllm_compressed: bool = True
    dtype: torch.dtype = torch.bfloat16

    @property
    def group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def compressed_kv_heads(self) -> int:
        return self.num_kv_heads - self.retrieval_kv_heads

    @property
    def comp_width(self) -> int:
        return self.sink_pages + self.window_pages

    @property
    def max_full_pages(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    def eager_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (16 << 20)
