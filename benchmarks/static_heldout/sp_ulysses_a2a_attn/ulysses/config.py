"""Configuration and head partitioning."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple


@dataclass
class UlyssesConfig:
    num_layers: int = 32
    vocab_size: int = 128256
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    sp_size: int = 4
    max_batch: int = 64
    max_pages_per_req: int = 8192
    num_pages: int = 65536
    graph_batch_sizes: List[int] = field(default_factory=lambda: [4, 8, 16, 32, 64])
    rope_theta: float = 500000.0

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_batch_sizes)

    def decode_workspace_bytes(self) -> int:
        # split-k partials of the largest bucket over this rank's heads, worst case one chunk per 64 pages
        heads = -(-self.num_q_heads // self.sp_size)
        chunks = max(1, self.max_pages_per_req // 64)
        return self.max_graph_bs * heads * chunks * (self.head_dim + 1) * 4

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_q_heads * (self.head_dim + 2) * 16


def default_workspace_bytes() -> int:
    """Scratch for the ragged prefill over full (gathered) sequences."""
    return 384 * 1024 * 1024


def split_heads(num_heads: int, sp_size: int) -> Tuple[int, int]:
    """(heads per rank, residual heads that every rank computes)."""
    assert num_heads >= sp_size, "fewer heads than sequence-parallel ranks"  # expect: FC109
    return num_heads // sp_size, num_heads % sp_size
