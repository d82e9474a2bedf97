"""Engine limits and fixed sizes for the async-scheduling engine."""
from dataclasses import dataclass
from typing import Tuple

# Shared by every decode bucket wrapper; the graphs are captured against it.
DECODE_GRAPH_WORKSPACE_BYTES = 256 * 1024 * 1024
PLACEHOLDER_TOKEN_ID = -1
DEFAULT_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class AsyncSchedConfig:
    max_num_reqs: int = 64
    max_num_tokens: int = 8192
    max_model_len: int = 8192
    page_size: int = 16
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    num_layers: int = 4
    hidden_size: int = 4096
    vocab_size: int = 32000
    eos_token_id: int = 2
    long_row_threshold: int = 4096
    graph_buckets: Tuple[int, ...] = DEFAULT_BUCKETS
    device: str = "cuda"

    @property
    def pages_per_seq(self) -> int:
        return (self.max_model_len + self.page_size - 1) // self.page_size

    @property
    def max_pages(self) -> int:
        return self.max_num_reqs * self.pages_per_seq

    @property
    def max_bucket(self) -> int:
        return max(self.graph_buckets)

    def prefill_workspace_bytes(self) -> int:  # split-k partials (fp32) plus indices
        return self.max_num_tokens * self.num_qo_heads * self.head_dim * 4 + (16 << 20)

    def long_decode_workspace_bytes(self) -> int:
        return self.max_num_reqs * self.num_qo_heads * self.pages_per_seq * 256
