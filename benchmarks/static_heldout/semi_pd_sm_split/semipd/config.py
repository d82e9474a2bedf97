from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

# Eager decode (batches past the largest bucket) and the sliding-window layers share this workspace.
DECODE_WS_MB = 160


@dataclass
class SemiPDConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 151936
    page_size: int = 16
    num_pages: int = 65536
    window: int = 4096  # sliding window of the odd layers
    max_context_len: int = 131072
    max_decode_bs: int = 256
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    max_prefill_tokens: int = 16384
    max_prefill_reqs: int = 64
    long_ctx_threshold: int = 32768
    prefill_sm_frac: float = 0.6
    rebalance_every: int = 64
    prefill_latency_target_ms: float = 250.0
    use_trtllm_context: bool = False
    context_ws_bytes: int = 256 * 1024 * 1024
    eos_token_id: int = 151645

    @property
    def max_pages_per_req(self) -> int:
        return math.ceil(self.max_context_len / self.page_size)

    def graph_ws_bytes(self) -> int:
        chunks = max(1, self.max_context_len // 4096)
        return max(self.decode_buckets) * self.num_qo_heads * chunks * (self.head_dim + 2) * 4 + (8 << 20)

    def prefill_ws_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 2) * 4 + (32 << 20)
