"""Engine limits for the chunked-vocabulary server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple


def default_decode_workspace_bytes() -> int:
    """The decode workspace FlashInfer's examples use."""
    return 128 * 1024 * 1024


@dataclass(frozen=True)
class ChunkSettings:
    vocab_size: int = 152064
    vocab_chunk: int = 16384
    max_top_k: int = 256
    hidden_size: int = 3584
    num_layers: int = 28
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    page_size: int = 16
    max_pages: int = 131072
    window_pages: int = 256  # recent pages kept besides the sink page
    max_batch: int = 512
    max_penalty_entries: int = 65536
    use_trtllm: bool = False
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    @property
    def num_chunks(self) -> int:
        return (self.vocab_size + self.vocab_chunk - 1) // self.vocab_chunk

    @property
    def max_context(self) -> int:
        return (self.window_pages + 1) * self.page_size

    def graph_workspace_bytes(self) -> int:
        splits = max(1, self.window_pages // 32)
        return self.max_graph_bs * self.num_qo_heads * splits * (self.head_dim + 1) * 4 + (8 << 20)

    def sink_workspace_bytes(self) -> int:
        # one page per row: no split-k, only the planner's int area and one partial per row and head
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 + (4 << 20)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.head_dim + 2) * 4 * 8
