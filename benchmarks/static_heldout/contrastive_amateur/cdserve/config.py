from dataclasses import dataclass, field
from typing import Tuple

AMATEUR_WORKSPACE_BYTES = 96 * 1024 * 1024


@dataclass
class CDConfig:
    max_batch: int = 64
    max_tokens: int = 8192
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    amateur_qo_heads: int = 16
    amateur_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    max_pages: int = 65536
    max_context: int = 32768
    alpha: float = 0.1
    beta: float = 0.5
    graph_sizes: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64))

    def expert_workspace_bytes(self) -> int:
        return self.max_tokens * self.num_qo_heads * self.head_dim * 4 + (64 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_tokens * self.num_qo_heads * self.head_dim * 8
