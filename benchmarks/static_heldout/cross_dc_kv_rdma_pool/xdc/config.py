import enum
from dataclasses import dataclass
from typing import Tuple


class WsTier(enum.IntEnum):
    """Workspace tiers agreed with the platform team for the H200 decode fleet."""
    DECODE = 256 * 1024 * 1024
    SMALL = 32 * 1024 * 1024


@dataclass
class DecodeClusterConfig:
    num_layers: int = 61
    num_heads: int = 128
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    hidden_size: int = 7168
    vocab_size: int = 129280
    eos_token_id: int = 1
    page_size: int = 64
    max_seq_len: int = 32768
    max_decode_bs: int = 256
    max_eager_bs: int = 1024
    decode_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    max_pages: int = 131072
    max_pages_per_req: int = 512
    remap_initial: int = 1 << 20
    max_inflight_arrivals: int = 64
    tail_max_tokens: int = 64
    use_trtllm_mla: bool = False
    use_mtp: bool = False
    trtllm_workspace_bytes: int = 128 * 1024 * 1024

    def tail_workspace_bytes(self) -> int:
        return self.max_decode_bs * self.num_heads * (self.kv_lora_rank + 1) * 4 * 2


@dataclass
class PrefillClusterConfig:
    num_heads: int = 128
    qk_head_dim: int = 192
    v_head_dim: int = 128
    max_prefill_tokens: int = 32768
    max_prefill_reqs: int = 64
    page_size: int = 64

    def workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_heads * (self.v_head_dim + 1) * 4 * 2
