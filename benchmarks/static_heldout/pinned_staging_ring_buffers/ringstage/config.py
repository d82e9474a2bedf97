from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

RING_DEPTH = 3


def default_workspace_bytes() -> int:
    """Scratch of the paged prefill wrapper (sized on the 4k-prompt benchmark)."""
    return 192 * 1024 * 1024


@dataclass
class RingConfig:
    ring_depth: int = RING_DEPTH
    max_batch: int = 256
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    tc_min_bs: int = 64  # buckets at least this large decode on tensor cores
    page_size: int = 16
    max_model_len: int = 16384
    num_pages: int = 65536
    num_layers: int = 8
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 32000
    eos_id: int = 2

    @property
    def max_graph_bs(self) -> int:
        return self.graph_buckets[-1]

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_model_len // self.page_size)

    def _split_k_bytes(self, rows: int) -> int:
        return rows * self.num_qo_heads * (self.head_dim + 1) * 4 * 32

    def graph_workspace_bytes(self) -> int:
        return self._split_k_bytes(self.max_graph_bs) + (8 << 20)

    def spill_workspace_bytes(self) -> int:
        return self._split_k_bytes(self.max_batch) + (16 << 20)
