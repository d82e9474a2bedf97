"""Static configuration of a Star Attention deployment."""

from dataclasses import dataclass
from typing import Tuple

import torch

# Workspace of the phase-1 ragged prefill (anchor + local block) and of the multi-token query prefill.
ANCHOR_WORKSPACE_BYTES = 256 * 1024 * 1024

DEFAULT_PAGE_SIZE = 16

# Wrapper state snapshotted after each capture, to diff plans when a replay goes wrong.
PLAN_STATE_FIELDS = ("_plan_info", "_cached_module")


@dataclass
class StarConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = DEFAULT_PAGE_SIZE
    block_tokens: int = 8192
    anchor_tokens: int = 8192
    max_context_tokens: int = 1 << 20
    max_batch_size: int = 64
    max_query_tokens: int = 4096
    max_positions: int = (1 << 20) + 8192
    num_hosts: int = 4
    host_rank: int = 0
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    use_trtllm_query: bool = True
    rope_theta: float = 1_000_000.0
    dtype: torch.dtype = torch.bfloat16

    @property
    def max_pages_per_seq(self) -> int:
        local = self.max_context_tokens // self.num_hosts + self.anchor_tokens + self.max_query_tokens
        return (local + self.page_size - 1) // self.page_size

    def query_workspace_bytes(self) -> int:
        # split-k partial outputs in fp32 plus one LSE per (token, head), up to 8 splits
        per_split = self.max_query_tokens * self.num_qo_heads * (self.head_dim + 1) * 4
        return 8 * per_split + (8 << 20)

    def graph_workspace_bytes(self, bucket: int) -> int:
        per_split = bucket * self.num_qo_heads * (self.head_dim + 1) * 4
        return 16 * per_split + (4 << 20)
