"""Server limits and the workspace tiers."""
import enum
from dataclasses import dataclass
from typing import Tuple


class WsTier(enum.IntEnum):
    SMALL = 32 * 1024 * 1024
    CASCADE = 192 * 1024 * 1024


@dataclass
class ChatServerConfig:
    max_rows: int = 64
    max_tokens_per_step: int = 4096
    max_context: int = 16384
    page_size: int = 16
    num_pages: int = 65536
    spare_pages: int = 256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    num_layers: int = 4
    hidden_size: int = 4096
    vocab_size: int = 32000
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    device: str = "cuda"

    @property
    def max_bucket(self) -> int:
        return max(self.graph_buckets)

    @property
    def pages_per_row(self) -> int:
        return -(-self.max_context // self.page_size)

    def decode_workspace_bytes(self) -> int:
        return self.max_bucket * self.num_qo_heads * self.head_dim * 4 * 32 + (8 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_tokens_per_step * self.num_qo_heads * self.head_dim * 4 + (16 << 20)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_rows * self.num_qo_heads * self.pages_per_row * 128
