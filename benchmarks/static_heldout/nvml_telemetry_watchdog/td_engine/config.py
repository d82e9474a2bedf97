from dataclasses import dataclass, field
from typing import List


@dataclass
class EngineConfig:
    num_layers: int = 28
    hidden_size: int = 3584
    vocab_size: int = 152064
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 32
    max_batch: int = 256
    max_pages: int = 131072
    max_prefill_tokens: int = 16384
    buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
    shadow_check: bool = False
    blocking_timing: bool = False
    watchdog_timeout_s: float = 30.0
    log_every: int = 100
    timing_window: int = 1024
    max_reference_workspace_bytes: int = 512 << 20

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * 4 * 256 + (16 << 20)
