from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple


@dataclass(frozen=True)
class LayerGroupSpec:
    name: str
    layer_ids: Tuple[int, ...]
    head_dim: int
    page_size: int
    num_qo_heads: int
    num_kv_heads: int
    num_pages: int
    window: int = -1
    kv_layout: str = "NHD"

    @property
    def is_local(self) -> bool:
        return self.window > 0


def _default_groups() -> List[LayerGroupSpec]:
    local = tuple(i for i in range(48) if i % 6 != 5)
    glob = tuple(i for i in range(48) if i % 6 == 5)
    return [
        LayerGroupSpec("local", local, head_dim=128, page_size=16, num_qo_heads=16, num_kv_heads=8, num_pages=131072, window=1024),
        LayerGroupSpec("global", glob, head_dim=256, page_size=32, num_qo_heads=16, num_kv_heads=8, num_pages=65536, kv_layout="HND"),
    ]


@dataclass
class ModelGroupsConfig:
    hidden_size: int = 3840
    vocab_size: int = 262144
    num_layers: int = 48
    eos_token_id: int = 1
    max_bs: int = 128
    max_tokens: int = 8192
    max_pages_per_seq: int = 4096
    graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    sm_version: int = 90
    groups: List[LayerGroupSpec] = field(default_factory=_default_groups)

    def group_of(self, layer_id: int) -> int:
        for g, spec in enumerate(self.groups):
            if layer_id in spec.layer_ids:
                return g
        raise KeyError(layer_id)

    def group_workspace_bytes(self, spec: LayerGroupSpec) -> int:
        # split-k partials of the largest step, fp32 outputs plus one LSE per row
        rows = self.max_tokens * spec.num_qo_heads
        return max(rows * 8 * (spec.head_dim + 1) * 4, 32 << 20)
