from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Iterable, Tuple

from mfserve.families import FamilySpec


class WsTier(IntEnum):
    """Workspace tiers, in bytes."""

    SMALL = 64 << 20
    PREFILL = 384 << 20


@dataclass
class ServeConfig:
    max_batch: int = 128
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    page_size: int = 16
    max_model_len: int = 8192
    num_pages: int = 32768
    window_workspace_bytes: int = 128 << 20

    @property
    def max_graph_bs(self) -> int:
        return self.graph_buckets[-1]

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_model_len // self.page_size)

    def decode_workspace_bytes(self, spec: FamilySpec) -> int:
        # split-k partials (fp32 o + lse) for the largest eager batch, up to 32 chunks per row
        return self.max_batch * spec.num_qo_heads * (spec.head_dim + 1) * 4 * 32 + (8 << 20)

    def graph_workspace_bytes(self, specs: Iterable[FamilySpec]) -> int:
        widest = max(s.num_qo_heads * (s.head_dim + 1) for s in specs)
        return self.max_graph_bs * widest * 4 * 32 + (8 << 20)
