"""Model and engine limits of the hybrid server."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List, Tuple


class LayerKind(enum.Enum):
    SWA = "swa"
    FULL = "full"


def layer_kinds(num_layers: int, full_every: int) -> List[LayerKind]:
    """Layer ``i`` is full attention when ``(i + 1) % full_every == 0`` (layers 3, 7, 11, ...)."""
    assert full_every > 0, "full_every must be positive"  # expect: FC109
    return [LayerKind.FULL if (i + 1) % full_every == 0 else LayerKind.SWA for i in range(num_layers)]


@dataclass
class HybridConfig:
    vocab_size: int = 262144
    hidden_size: int = 2560
    num_layers: int = 34
    full_every: int = 4
    window: int = 1024
    num_qo_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 256
    page_size: int = 16
    full_pool_pages: int = 262144
    swa_pool_pages: int = 65536
    max_batch: int = 256
    max_context: int = 131072
    max_num_tokens: int = 16384
    trtllm_full_threshold: int = 32768
    graph_buckets: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 24, 32, 48, 64))

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    @property
    def swa_pages_per_req(self) -> int:
        # the window plus the page being written
        return self.window // self.page_size + 1

    def decode_workspace_bytes(self, kind: LayerKind) -> int:
        context = self.window if kind is LayerKind.SWA else self.max_context
        splits = max(1, context // 4096)
        return self.max_batch * self.num_qo_heads * splits * (self.head_dim + 1) * 4 + (8 << 20)

    def graph_workspace_bytes(self, kind: LayerKind) -> int:
        context = self.window if kind is LayerKind.SWA else self.max_context
        splits = max(1, context // 4096)
        return self.max_graph_bs * self.num_qo_heads * splits * (self.head_dim + 1) * 4 + (4 << 20)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.head_dim + 2) * 4 * 32
