from __future__ import annotations

import dataclasses
from typing import Tuple


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    vocab_size: int = 32000
    hidden_size: int = 2048
    num_layers: int = 16
    num_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 16384
    max_batch_size: int = 64
    max_pages_per_request: int = 256
    max_prefill_tokens: int = 8192
    graph_batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    max_logprobs: int = 20
    # n>1 sampling shares the prompt pages; decode through a two-level cascade
    share_prompt_pages: bool = False
    dtype: str = "float16"

    def eager_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_heads * (self.head_dim + 1) * 4 * 16 + (32 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_heads * (self.head_dim + 1) * 4 * 2 + (64 << 20)

    def cascade_workspace_bytes(self) -> int:
        return 2 * self.eager_workspace_bytes()
