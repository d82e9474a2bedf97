"""Model specs for the two tiers and the cascade's limits."""

from __future__ import annotations

import dataclasses
from typing import Tuple

# Graph workspace per tier, from the capture-time profile of each model.
_GRAPH_WS_MIB = {"small": 96, "large": 320}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int = 32000
    page_size: int = 16
    num_pages: int = 65536
    max_batch: int = 128
    max_context_len: int = 16384
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    max_graph_context: int = 8192
    window_layers: Tuple[int, ...] = ()
    window: int = 4096
    trtllm_context_min: int = 4096

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (8 << 20)

    def window_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * 4 + (8 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_context_len * self.num_qo_heads * (self.head_dim + 1) * 4 * 2


@dataclasses.dataclass
class CascadeConfig:
    small: ModelSpec = dataclasses.field(default_factory=lambda: ModelSpec(
        "small", num_layers=12, hidden_size=1024, num_qo_heads=8, num_kv_heads=2, head_dim=128))
    large: ModelSpec = dataclasses.field(default_factory=lambda: ModelSpec(
        "large", num_layers=40, hidden_size=5120, num_qo_heads=40, num_kv_heads=8, head_dim=128,
        window_layers=tuple(range(0, 40, 4))))
    max_requests: int = 512
    max_context_len: int = 16384
    escalate_entropy: float = 2.5
    int_workspace_bytes: int = 8 << 20
