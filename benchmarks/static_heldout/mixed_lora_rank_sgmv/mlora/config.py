from dataclasses import dataclass
from typing import Tuple


@dataclass
class EngineConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000
    page_size: int = 16
    max_seq_len: int = 4096
    max_decode_bs: int = 128
    max_prefill_tokens: int = 8192
    max_prefill_reqs: int = 32
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    rank_buckets: Tuple[int, ...] = (8, 16, 32, 64)
    max_loras: int = 16
    initial_max_rank: int = 16
    max_vtokens: int = 64
    use_trtllm: bool = False
    trtllm_workspace_bytes: int = 128 * 1024 * 1024

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    @property
    def max_pages(self) -> int:
        return self.max_decode_bs * self.max_pages_per_req + 1
