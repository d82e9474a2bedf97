from dataclasses import dataclass
from typing import Tuple

import torch

from .constants import GRAPH_BATCH_SIZES, PAGE_SIZE


@dataclass
class EngineConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 14336
    rope_theta: float = 500000.0
    page_size: int = PAGE_SIZE
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    sliding_window: int = 4096
    window_every: int = 4
    attention_backend: str = "flashinfer"
    use_trtllm_decode: bool = False
    graph_batch_sizes: Tuple[int, ...] = GRAPH_BATCH_SIZES
    device_id: int = 0
    dtype: torch.dtype = torch.bfloat16

    @property
    def pages_per_request(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    @property
    def max_pages(self) -> int:
        return self.max_batch_size * self.pages_per_request

    def graph_workspace_bytes(self) -> int:
        # split-k partials: (head_dim + 1) floats per head and split, one split per 512 tokens of context
        splits = max(1, self.max_context_len // 512)
        partials = self.max_batch_size * self.num_heads * (self.head_dim + 1) * 4 * splits
        return partials + (16 << 20)

    def eager_workspace_bytes(self) -> int:
        splits = max(1, self.max_context_len // 512)
        partials = self.max_num_tokens * self.num_heads * (self.head_dim + 1) * 4 * splits
        return partials + (32 << 20)
