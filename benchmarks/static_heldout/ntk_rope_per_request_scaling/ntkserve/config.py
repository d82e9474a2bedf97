"""Engine limits and the trained-context facts that decide NTK scaling."""

from dataclasses import dataclass, field
from typing import List

# Measured once on a 16-request benchmark; the eager decode path keeps using it.
EAGER_DECODE_WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass
class NTKConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 64
    max_pages: int = 131072
    max_prefill_tokens: int = 16384
    trained_ctx: int = 8192
    max_ctx: int = 131072
    long_row_threshold: int = 32768
    rope_theta: float = 500000.0
    use_trtllm_prefill: bool = False
    buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs: one fp32 row (plus its LSE) per request, head and split
        splits = max(1, self.max_ctx // (self.page_size * 256))
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * splits

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2

    def long_rows(self, bs: int) -> int:
        """Rows at the end of each bucket reserved for requests past ``long_row_threshold``."""
        return max(1, bs // 8)
