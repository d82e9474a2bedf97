from dataclasses import dataclass
from typing import Tuple


@dataclass
class EventEngineConfig:
    vocab_size: int = 32000
    hidden: int = 4096
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_blocks: int = 65536
    max_blocks_per_seq: int = 2048
    max_batch: int = 128
    max_num_tokens: int = 8192
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    use_trtllm_context: bool = False
    router_endpoint: str = "127.0.0.1:5557"

    def decode_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * self.head_dim * 4 * 32 + (8 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * self.head_dim * 2 + (32 << 20)

    def context_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_qo_heads * 16 + (64 << 20)
