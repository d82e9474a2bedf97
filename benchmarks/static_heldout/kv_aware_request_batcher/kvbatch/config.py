"""Batcher limits and process-wide knobs."""

from dataclasses import dataclass, field
from typing import List

import torch

# name of the attribute FlashInfer sets once a wrapper's JIT module is loaded
CACHED_MODULE_ATTR = "_cached_module"


class _Knobs:
    """Process-wide knobs, set once at import."""

    def __init__(self) -> None:
        self.decode_ws_bytes = 256 * 1024 * 1024
        self.log_every = 50


knobs = _Knobs()


@dataclass
class BatcherConfig:
    vocab_size: int = 152_064
    hidden_size: int = 3584
    intermediate_size: int = 18_944
    num_layers: int = 4
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    kv_layout: str = "HND"
    max_slots: int = 1024
    max_rows: int = 256
    page_budget: int = 32_768
    max_pages: int = 131_072
    max_prefill_tokens: int = 8192
    prefix_pages_max: int = 512
    decode_buckets: List[int] = field(default_factory=lambda: [8, 16, 32, 64, 128, 256])
    use_trtllm_prefill: bool = True
    device: torch.device = field(default_factory=lambda: torch.device("cuda", 0))

    def prefill_ws_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 + (32 << 20)

    def cascade_ws_bytes(self) -> int:
        return self.decode_buckets[-1] * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 * 16 + (8 << 20)
