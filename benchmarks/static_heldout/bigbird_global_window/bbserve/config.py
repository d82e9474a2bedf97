from __future__ import annotations

from dataclasses import dataclass

# graph-mode workspaces per branch, in bytes
_WS_TIERS = {"window": 96 << 20, "global": 160 << 20}

# the selector packs a row's global block ids in one 64-bit mask
_MAX_GLOBAL_BLOCKS = 64


@dataclass(frozen=True)
class EngineConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 65536
    page_size: int = 64
    block_size: int = 64
    window: int = 4096
    num_global_blocks: int = 4
    num_random_blocks: int = 3
    max_adaptive_blocks: int = 8
    score_threshold: float = 0.0
    num_pages: int = 131072
    max_pages_per_req: int = 2048
    max_graph_bs: int = 64
    max_prefill_tokens: int = 16384
    prefill_workspace_bytes: int = 512 * 1024 * 1024
    seed: int = 0

    @property
    def window_pages(self) -> int:
        return self.window // self.page_size + 2

    @property
    def max_global_pages(self) -> int:
        per_block = self.block_size // self.page_size
        return (self.num_global_blocks + self.max_adaptive_blocks) * per_block

    def eager_workspace_bytes(self) -> int:
        return self.max_graph_bs * 4 * self.num_qo_heads * (self.head_dim + 1) * 4 * 32

    def dense_workspace_bytes(self) -> int:
        return self.max_graph_bs * self.num_qo_heads * (self.head_dim + 1) * 4 * 64
