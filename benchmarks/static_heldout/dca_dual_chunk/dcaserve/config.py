"""Engine limits and dual chunk attention parameters.

Dual chunk attention (DCA) splits a long context into chunks of ``chunk_size`` tokens. Keys are rotated with
their position inside their chunk, so no relative distance ever exceeds what the model was trained on; each
decode query is rotated three ways and attends to three key streams:

* intra: the keys of its own chunk (ordinary causal attention),
* succ:  the keys of the previous chunk, with the query placed ``local_size`` past the chunk end,
* inter: every older chunk, with the query pinned at position ``chunk_size - 1``.

The three partial outputs are merged with their log-sum-exp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

# Scratch for the ragged intra-chunk prefill of newly arrived prompt chunks.
INTRA_RAGGED_WORKSPACE_BYTES = 192 * 1024 * 1024


@dataclass
class DCAConfig:
    chunk_size: int = 8192
    local_size: int = 1024
    page_size: int = 16
    max_batch_size: int = 64
    max_num_tokens: int = 16384
    max_context_len: int = 1_010_000
    num_layers: int = 28
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 152064
    graph_batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
    rope_theta: float = 1_000_000.0
    eos_token_id: int = 151645
    # Blackwell: run the first chunk of a prompt through trtllm-gen's context kernel
    trtllm_first_chunk: bool = False

    def __post_init__(self) -> None:
        if self.chunk_size % self.page_size:
            raise ValueError(f"chunk_size={self.chunk_size} must be a multiple of page_size={self.page_size}")
        if not 0 < self.local_size < self.chunk_size:
            raise ValueError(f"local_size={self.local_size} must lie in (0, chunk_size={self.chunk_size})")

    @property
    def chunk_pages(self) -> int:
        return self.chunk_size // self.page_size

    @property
    def max_pages_per_req(self) -> int:
        return math.ceil(self.max_context_len / self.page_size)

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_batch_sizes)

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32 values + lse) for three streams, up to 32 splits a row
        per_row = self.num_qo_heads * (self.head_dim + 1) * 4 * 32
        return max(64 << 20, 3 * self.max_batch_size * per_row)

    def prefill_workspace_bytes(self) -> int:
        per_token = self.num_qo_heads * (self.head_dim + 1) * 4
        return max(128 << 20, 2 * self.max_num_tokens * per_token)
