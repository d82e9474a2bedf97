from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

# long tool schemas make prompts long: the prefill runs on trtllm-gen
PREFILL_BACKEND = "trtllm-gen"


@dataclass
class ServerConfig:
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 32768
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 151936
    max_batch: int = 256
    max_model_len: int = 32768
    max_num_tokens: int = 16384
    max_stop_ids: int = 16
    max_pages_per_seq: int = 2048
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    def bucket_for(self, n: int) -> int:
        return next((b for b in self.graph_buckets if b >= n), -1)

    def prefill_ws_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * (self.head_dim + 2) * 4
