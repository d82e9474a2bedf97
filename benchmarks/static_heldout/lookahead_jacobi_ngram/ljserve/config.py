"""Static configuration of the lookahead (Jacobi) decoding server."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

# The verify graphs and the eager verifier share one float workspace, sized once for the largest bucket we benchmarked.
VERIFY_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class LookaheadConfig:
    window_size: int = 7          # W: Jacobi iterations kept in flight per request
    ngram_size: int = 5           # N: length of an n-gram in the pool (key token + N-1 continuation)
    max_verify: int = 7           # G: candidate n-grams verified per request and step
    page_size: int = 16
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    max_batch_size: int = 64
    max_seq_len: int = 8192
    max_prefill_tokens: int = 16384
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    decode_workspace_mb: int = 128
    pool_capacity: int = 1 << 16
    pool_per_key: int = 16
    rope_theta: float = 500000.0

    @property
    def lookahead_len(self) -> int:
        return self.window_size * (self.ngram_size - 1)

    @property
    def verify_len(self) -> int:
        return self.max_verify * (self.ngram_size - 1)

    @property
    def tokens_per_request(self) -> int:
        # the last accepted token, the Jacobi window and the candidate n-grams, in one query block
        return 1 + self.lookahead_len + self.verify_len

    def max_pages_per_request(self) -> int:
        return math.ceil((self.max_seq_len + self.tokens_per_request) / self.page_size)

    def prefill_workspace_bytes(self, chunk_tokens: int) -> int:
        # split-k partial outputs (fp32) and their log-sum-exp for every token of a chunk
        per_token = self.num_qo_heads * (self.head_dim + 1) * 4
        return max(64 << 20, chunk_tokens * per_token)

    def trtllm_workspace_bytes(self) -> int:
        rows = self.max_batch_size * self.tokens_per_request
        return rows * self.num_qo_heads * (self.head_dim + 2) * 4

    def bucket_for(self, bs: int) -> int:
        for b in self.graph_buckets:
            if b >= bs:
                return b
        return 0
