"""Static configuration of a cross-layer attention deployment."""
from __future__ import annotations

import dataclasses
from typing import Tuple

import torch

# Float workspace of the paged prompt prefill.  Picked on an 8B model with 4k
# prompts and never revisited when the engine learned 32k prompts.
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass
class CLAConfig:
    num_layers: int = 32
    cla_factor: int = 2  # adjacent layers per KV group; the first one produces KV
    hidden_size: int = 4096
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 65536
    max_batch: int = 160
    max_num_tokens: int = 8192
    max_pages_per_req: int = 512
    local_window: int = 4096
    local_group_every: int = 2  # every second group attends to a sliding window only
    long_context_threshold: int = 32768
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 160)
    dtype: torch.dtype = torch.bfloat16

    @property
    def num_groups(self) -> int:
        return self.num_layers // self.cla_factor

    @property
    def max_context(self) -> int:
        return self.max_pages_per_req * self.page_size

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32 values + lse) for every token and head, two chunks each
        per_token = self.num_q_heads * (self.head_dim + 1) * 4
        return 2 * self.max_num_tokens * per_token + (16 << 20)

    def trtllm_workspace_bytes(self) -> int:
        # multi-CTA counters and partials, bounded by the batch and heads
        return self.max_batch * self.num_q_heads * self.head_dim * 4 * 8 + (4 << 20)
