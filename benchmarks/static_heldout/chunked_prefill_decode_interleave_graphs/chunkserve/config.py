import enum
from dataclasses import dataclass
from typing import Tuple


class WsSize(enum.IntEnum):
    """Workspace sizes fixed when the ragged path was tuned on 512-token chunks."""

    RAGGED = 512 << 20
    MERGE = 64 << 20


@dataclass
class ChunkConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    intermediate_size: int = 14336
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    page_size: int = 16
    num_pages: int = 50000
    max_model_len: int = 131072
    token_budget: int = 2048
    chunk_size: int = 512
    max_running: int = 256
    max_decode_bs: int = 160
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160)
    max_pages_per_seq: int = 8192
    long_context_threshold: int = 65536
    trtllm_workspace_bytes: int = 128 << 20
    split_kv_chunks: int = 16

    @property
    def gqa_group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    def decode_workspace_bytes(self) -> int:
        rows = max(self.max_decode_bs, self.max_running)
        return rows * self.num_qo_heads * self.split_kv_chunks * (self.head_dim + 1) * 4 + (8 << 20)

    def paged_prefill_workspace_bytes(self) -> int:
        return self.token_budget * self.num_qo_heads * (self.head_dim + 1) * 4 * 4 + (16 << 20)
