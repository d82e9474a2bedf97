from dataclasses import dataclass, field
from typing import List


@dataclass
class OverlapConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 256
    max_pages: int = 131072
    max_prefill_tokens: int = 8192
    max_prefill_requests: int = 32
    pool_block_bytes: int = 2 << 20
    pool_blocks: int = 512
    pool_grow_blocks: int = 128
    handoff_rows: int = 0
    buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2

    def decode_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * 32

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * 4 * 256 + (8 << 20)
