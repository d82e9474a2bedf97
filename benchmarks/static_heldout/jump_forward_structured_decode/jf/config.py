from __future__ import annotations

import dataclasses
from typing import Tuple

# Planner workspaces per role, in MiB, measured on the H100 benchmark batch mix.
WS_MIB = {"mixed": 384, "decode": 128}


@dataclasses.dataclass
class JFConfig:
    vocab_size: int = 32000
    hidden_size: int = 2048
    num_layers: int = 16
    num_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 16384
    max_batch_size: int = 128
    max_pages_per_request: int = 256
    max_num_tokens: int = 8192
    # longest forced run appended in one step; longer runs are split across steps
    max_jump_tokens: int = 64
    graph_batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    # also capture small mixed steps (one jump-forward row + decodes) as graphs
    capture_mixed: bool = True
    mixed_graph_tokens: int = 16
    dtype: str = "bfloat16"

    @property
    def bitmask_words(self) -> int:
        return -(-self.vocab_size // 32)

    def mixed_workspace_bytes(self) -> int:
        return self.max_num_tokens * self.num_heads * (self.head_dim + 1) * 4 * 2 + (32 << 20)

    def decode_workspace_bytes(self) -> int:
        return self.max_batch_size * self.num_heads * (self.head_dim + 1) * 4 * 16 + (16 << 20)
