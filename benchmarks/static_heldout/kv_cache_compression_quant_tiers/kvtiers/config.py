from dataclasses import dataclass, field
from enum import IntEnum
from typing import Tuple


class Tier(IntEnum):
    BF16 = 0
    FP8 = 1
    INT4 = 2


@dataclass
class TierConfig:
    num_layers: int = 28
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 128
    max_tokens: int = 8192
    pages_per_tier: Tuple[int, int, int] = (16384, 32768, 65536)
    fp8_after_steps: int = 512
    int4_after_steps: int = 4096
    int4_group_size: int = 64
    int4_workspace_bytes: int = 64 * 1024 * 1024
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    long_context: int = 16384
    extra: dict = field(default_factory=dict)

    @property
    def total_pages(self) -> int:
        return sum(self.pages_per_tier)

    def trtllm_prefill_bytes(self) -> int:
        return self.max_tokens * self.num_qo_heads * self.head_dim * 4
