from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple


@dataclass
class DeterminismConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    page_size: int = 1  # token-granular KV, like SGLang's req_to_token pool
    max_batch_size: int = 160
    max_num_tokens: int = 8192
    max_context_len: int = 65536
    max_total_tokens: int = 1 << 21
    # Every split-kv kernel splits at these token counts, whatever the batch looks like.
    kv_split_tokens: int = 2048
    prefill_split_tokens: int = 4096
    # Decode through the prefill kernel so that a token's logits match between prefill and decode.
    unified_kernel: bool = False
    use_trtllm_decode: bool = False
    prefill_workspace_bytes: int = 512 * 1024 * 1024
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160)
    audit: bool = False

    @property
    def max_kv_chunks(self) -> int:
        return math.ceil(self.max_context_len / self.kv_split_tokens)

    def trtllm_workspace_bytes(self) -> int:
        # counters + partial outputs for max_kv_chunks splits of every row
        per_row = self.num_qo_heads * self.max_kv_chunks * (self.head_dim * 4 + 8)
        return self.max_batch_size * per_row + (4 << 20)

    def context_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim * 4 + 8) + (4 << 20)
