from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Tuple

# The two softmax branches of a differential head. Order matters: the engine subtracts the second one.
BRANCHES: Tuple[str, str] = ("pos", "neg")

# Paged prefill for cached prompt suffixes. Sized once for the 4k-token chunks of the first release.
PREFILL_WORKSPACE_BYTES = 384 * 1024 * 1024


@dataclass
class DiffConfig:
    num_layers: int = 24
    hidden_size: int = 2048
    num_heads: int = 16  # differential heads; each is two softmax heads
    num_kv_heads: int = 4
    head_dim: int = 64  # per softmax head
    vocab_size: int = 32000
    page_size: int = 16
    max_batch_size: int = 256
    max_context_len: int = 32768
    max_num_batched_tokens: int = 8192
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    # Layers converted from the base checkpoint keep a plain softmax head ("anchor" layers).
    anchor_layers: Tuple[int, ...] = (0,)
    decode_workspace_bytes: int = 128 * 1024 * 1024
    lambda_init_decay: float = 0.3
    rope_theta: float = 10000.0
    eos_token_ids: Tuple[int, ...] = (2,)
    dtype: str = "bfloat16"
    extra: dict = field(default_factory=dict)

    @property
    def max_pages_per_req(self) -> int:
        return math.ceil(self.max_context_len / self.page_size)

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    def graph_workspace_bytes(self) -> int:
        # split-k partial outputs and LSEs of the largest captured batch, both branches, plus plan info
        chunks = max(1, self.max_context_len // 2048)
        partial = self.max_graph_bs * 2 * self.num_heads * chunks * (self.head_dim + 1) * 4
        return partial + (8 << 20)

    def ragged_workspace_bytes(self) -> int:
        return self.max_num_batched_tokens * 2 * self.num_heads * (self.head_dim + 1) * 4 + (16 << 20)

    def is_anchor(self, layer_id: int) -> bool:
        return layer_id in self.anchor_layers
