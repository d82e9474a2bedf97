"""Engine limits and the sizes derived from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

PAGE_SIZE = 16
DECODE_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
# The shared-prefix cascade path got its own workspace when cascade prefill was added.
CASCADE_WORKSPACE_BYTES = 128 * 1024 * 1024

assert PAGE_SIZE in (16, 32, 64), "page size must match the paged KV kernels"  # ok: FC109


@dataclass(frozen=True)
class EngineConfig:
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    num_layers: int = 8
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 32000
    page_size: int = PAGE_SIZE
    num_pages: int = 65536
    sliding_window: int = 4096
    window_every: int = 2
    long_context_len: int = 16384
    decode_buckets: Tuple[int, ...] = DECODE_BUCKETS
    device: str = "cuda"
    dtype: torch.dtype = torch.bfloat16

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_seq_len // self.page_size)

    def bucket_for(self, bs: int) -> Optional[int]:
        for bucket in self.decode_buckets:
            if bucket >= bs:
                return bucket
        return None

    def is_window_layer(self, layer_id: int) -> bool:
        return layer_id % self.window_every == 1

    def float_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32 values + LSE) for every token and head, plus the planner's scratch
        tokens = max(self.max_num_tokens, self.max_batch_size)
        return tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 + (16 << 20)

    def trtllm_workspace_bytes(self) -> int:
        # multi-CTA counters and partial results grow with the decode batch and the heads
        return self.max_batch_size * self.num_qo_heads * (self.head_dim + 2) * 4 * 16 + (4 << 20)

    def graph_workspace_bytes(self) -> int:
        return max(self.decode_buckets) * self.num_qo_heads * (self.head_dim + 1) * 4 * 32 + (8 << 20)
