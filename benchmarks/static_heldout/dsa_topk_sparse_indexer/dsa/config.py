"""Static configuration of the DSA serving engine."""

from __future__ import annotations

import dataclasses
from typing import Tuple

# The captured MLA wrappers of every bucket share one float workspace.  Sized once
# for the largest bucket we benchmarked (128 x 2048 selected tokens).
MLA_GRAPH_WORKSPACE_BYTES = 192 * 1024 * 1024


@dataclasses.dataclass
class DSAConfig:
    vocab_size: int = 129280
    hidden_size: int = 2048
    num_layers: int = 8
    # the first layers keep dense MLA; the indexer drives the others
    first_sparse_layer: int = 2
    num_heads: int = 16
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    index_n_heads: int = 8
    index_head_dim: int = 128
    index_topk: int = 2048
    page_size: int = 64
    max_batch_size: int = 128
    max_context_len: int = 32768
    max_prefill_tokens: int = 8192
    graph_batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    dense_workspace_bytes: int = 128 * 1024 * 1024
    trtllm_workspace_bytes: int = 64 * 1024 * 1024
    dtype: str = "bfloat16"

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def max_pages_per_request(self) -> int:
        return -(-self.max_context_len // self.page_size)

    def sparse_workspace_bytes(self) -> int:
        # split-k partial outputs: rows x heads x (latent + lse) in fp32, up to 8 chunks
        rows = max(self.max_batch_size, self.max_prefill_tokens)
        return rows * self.num_heads * (self.kv_lora_rank + 1) * 4 * 8 + (16 << 20)
