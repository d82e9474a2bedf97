"""Pool limits, priorities, workspace tiers and the free-page watermarks."""

from __future__ import annotations

import dataclasses
import enum
from typing import Tuple


class Priority(enum.IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2


class WorkspaceTier(enum.Enum):
    SMALL = 64
    LARGE = 256

    def nbytes(self) -> int:
        return self.value << 20


@dataclasses.dataclass(frozen=True)
class PoolLimits:
    num_pages: int = 131072
    page_size: int = 16
    max_rows: int = 256
    max_pages_per_req: int = 2048
    graph_buckets: Tuple[int, ...] = (8, 16, 32, 64, 128)
    chunk_tokens: int = 256
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000

    @property
    def max_bucket(self) -> int:
        return max(self.graph_buckets)

    def overflow_workspace_bytes(self) -> int:
        return self.max_rows * self.num_qo_heads * self.head_dim * 4 * 8 + (4 << 20)

    def chunk_workspace_bytes(self) -> int:
        return self.chunk_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (16 << 20)


class Watermarks:
    """Free-page watermarks: below ``low`` the reclaimer runs until ``high`` pages are free; ``reserve_high`` pages
    stay set aside for high-priority admissions."""

    def __init__(self, low: int, high: int, reserve_high: int):
        self._validate(low, high)
        self.low = low
        self.high = high
        self.reserve_high = reserve_high

    def _validate(self, low: int, high: int) -> None:
        assert 0 <= low < high  # expect: FC109
