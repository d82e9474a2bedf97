from dataclasses import dataclass
from typing import Tuple

REPO_WS_BYTES = 48 << 20

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = 32007, 32008, 32009


@dataclass(frozen=True)
class ServeLimits:
    max_batch: int = 96
    max_prompt: int = 16384
    max_tokens: int = 32768
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 32
    max_pages: int = 100000
    buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96)

    def workspace_bytes(self) -> int:
        return self.max_batch * self.num_heads * self.head_dim * 64 + (16 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_tokens * self.num_heads * self.head_dim * 8
