from dataclasses import dataclass
from typing import Tuple

import torch

# Fixed workspaces, by wrapper.
FIXED_WS_BYTES = {
    "prefill": 384 * 1024 * 1024,
}


@dataclass
class StreamConfig:
    num_layers: int = 80
    resident_layers: int = 24  # captured in the decode graphs, never evicted
    num_slots: int = 32  # device layer slots, resident ones included
    num_qo_heads: int = 64
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 28672
    vocab_size: int = 128256
    page_size: int = 16
    window: int = 4096  # sliding window of the odd layers, 0 to disable
    max_batch_size: int = 64
    max_seq_len: int = 32768
    max_prefill_tokens: int = 8192
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    dtype: torch.dtype = torch.bfloat16

    @property
    def hidden(self) -> int:
        return self.num_qo_heads * self.head_dim

    @property
    def qkv_out(self) -> int:
        return (self.num_qo_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def layer_numel(self) -> int:
        h = self.hidden
        return self.qkv_out * h + h * h + 2 * self.intermediate * h + self.intermediate * h

    @property
    def max_pages(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    def graph_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (16 << 20)

    def eager_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 1) * 4 * 32 + (32 << 20)
