import enum
from dataclasses import dataclass
from typing import Tuple


class WsBytes(enum.IntEnum):
    GRAPH = 192 * 1024 * 1024


@dataclass
class MLAConfig:
    num_layers: int = 61
    hidden_size: int = 7168
    num_heads: int = 128
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    page_size: int = 64
    max_batch_size: int = 128
    max_num_tokens: int = 16384
    max_context_len: int = 163840
    num_pages: int = 32768
    trtllm_threshold: int = 32768
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    use_graphs: bool = True

    @property
    def softmax_scale(self) -> float:
        return (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5

    def max_pages_per_req(self) -> int:
        return -(-self.max_context_len // self.page_size)

    def prefill_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim) * 4

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_heads * (self.kv_lora_rank + 1) * 4 * 16
