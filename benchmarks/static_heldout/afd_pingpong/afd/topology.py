from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

# Ragged prefill on the attention ranks. Prompts are chunked to 8k tokens before they get here.
RAGGED_WORKSPACE_BYTES = 1 << 28


@dataclass
class AFDTopology:
    attn_ranks: int = 8
    ffn_ranks: int = 16
    num_microbatches: int = 2
    max_mb_size: int = 128
    buckets: Tuple[int, ...] = (8, 16, 32, 64, 128)
    uneven_tail: bool = False  # the last micro-batch takes the remainder rows
    num_layers: int = 48
    hidden_size: int = 7168
    num_qo_heads: int = 64
    num_kv_heads: int = 8
    head_dim: int = 128
    num_experts: int = 256
    top_k: int = 8
    page_size: int = 32
    max_context_len: int = 65536
    vocab_size: int = 129280

    @property
    def max_pages_per_req(self) -> int:
        return math.ceil(self.max_context_len / self.page_size)

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.ffn_ranks

    def check(self) -> None:
        assert self.max_mb_size == max(self.buckets), "largest bucket must cover a full micro-batch"  # ok: FC109
        assert self.num_experts % self.ffn_ranks == 0

    def decode_ws_bytes(self) -> int:
        chunks = max(1, self.max_context_len // 8192)
        return self.max_mb_size * self.num_qo_heads * chunks * (self.head_dim + 2) * 4 + (4 << 20)

    def trtllm_ws_bytes(self) -> int:
        return self.max_mb_size * self.num_qo_heads * (self.head_dim * 4 + 16) * 16 + (4 << 20)

    def eager_ws_bytes(self) -> int:
        # batches above the largest bucket: at most num_microbatches * max_mb_size rows in one eager micro-batch
        return 2 * self.decode_ws_bytes() * self.num_microbatches
