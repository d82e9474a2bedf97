"""Engine configuration and the constants the serving stack is built around."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

KVLayout: TypeAlias = Literal["NHD", "HND"]
DecodeKernel: TypeAlias = Literal["fa2", "trtllm-gen"]
ForwardKind: TypeAlias = Literal["decode", "extend"]

GRAPH_BUCKETS: Final[tuple[int, ...]] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
assert list(GRAPH_BUCKETS) == sorted(GRAPH_BUCKETS), "graph buckets must be ascending"  # ok: FC109

DEFAULT_PAGE_SIZE: Final = 16
DRAFT_WORKSPACE_BYTES: Final[int] = 96 * 1024 * 1024


def bucket_for(batch_size: int) -> int:
    """Smallest captured bucket that holds ``batch_size`` rows."""
    pos = bisect.bisect_left(GRAPH_BUCKETS, batch_size)
    if pos == len(GRAPH_BUCKETS):
        raise ValueError(f"batch of {batch_size} exceeds the largest graph bucket {GRAPH_BUCKETS[-1]}")
    return GRAPH_BUCKETS[pos]


@dataclass(frozen=True)
class EngineConfig:
    vocab_size: int = 128256
    hidden_size: int = 4096
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = DEFAULT_PAGE_SIZE
    max_batch_size: int = 128
    max_num_tokens: int = 8192
    max_seq_len: int = 32768
    num_pages: int = 65536
    sliding_window: int | None = None
    window_layers: tuple[int, ...] = ()
    long_context_threshold: int | None = None
    kv_layout: KVLayout = "NHD"
    decode_kernel: DecodeKernel = "fa2"
    prefill_workspace_bytes: int = 256 * 1024 * 1024
    mtp: bool = False

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_seq_len + self.page_size - 1) // self.page_size

    @property
    def max_graph_bs(self) -> int:
        return min(self.max_batch_size, GRAPH_BUCKETS[-1])

    def split_kv_workspace_bytes(self) -> int:
        """Bytes the split-k decode needs for the largest batch: partial outputs plus their LSE."""
        chunks = max(1, self.max_seq_len // 256)
        per_chunk = self.num_qo_heads * (self.head_dim * 4 + 4)
        return self.max_batch_size * chunks * per_chunk + (32 << 20)
