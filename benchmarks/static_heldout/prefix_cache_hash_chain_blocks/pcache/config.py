"""Limits of the prefix-caching engine."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

# One workspace is shared by the graph-mode decode wrappers of every bucket.
DECODE_WORKSPACE_BYTES = 256 * 1024 * 1024
NULL_BLOCK_ID = 0


@dataclass
class PrefixCacheConfig:
    block_size: int = 16
    num_blocks: int = 8192
    max_num_seqs: int = 128
    max_model_len: int = 8192
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    num_layers: int = 32
    vocab_size: int = 32000
    prefill_workspace_bytes: int = 256 * 1024 * 1024
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    system_prompt_blocks: int = 4  # the deployment's cached system prompt, shared by every request

    @property
    def max_blocks_per_seq(self) -> int:
        return (self.max_model_len + self.block_size - 1) // self.block_size

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    def trtllm_workspace_bytes(self) -> int:  # split-k partials and LSEs per sequence, plus semaphores
        return self.max_num_seqs * self.num_qo_heads * (self.head_dim + 2) * 64 + (4 << 20)

    def bucket_for(self, bs: int) -> int:
        return next((b for b in self.graph_buckets if b >= bs), -1)
