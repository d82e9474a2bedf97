import enum
from dataclasses import dataclass
from typing import Tuple


class WorkspaceTier(enum.Enum):
    SMALL = 64
    LARGE = 256

    def nbytes(self) -> int:
        return self.value << 20


@dataclass
class AutotuneConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 32768
    max_batch: int = 256
    max_pages_per_seq: int = 512
    chunk_tokens: int = 64
    num_buckets: int = 10
    retune_every: int = 2000
    min_bucket_gain: float = 0.05
    initial_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)

    def graph_workspace_bytes(self) -> int:
        chunks = max(1, self.max_pages_per_seq // 32)
        return self.max_batch * self.num_qo_heads * chunks * (self.head_dim + 1) * 4 + (16 << 20)

    def eager_workspace_bytes(self) -> int:
        return self.graph_workspace_bytes() + self.chunk_tokens * self.num_qo_heads * self.head_dim * 4

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * 64 * (self.head_dim + 2) * 4 + (8 << 20)
