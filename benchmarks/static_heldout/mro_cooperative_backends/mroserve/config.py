"""Engine configuration and the limits the attention backends share."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch

PAGE_SIZE = 16
assert PAGE_SIZE & (PAGE_SIZE - 1) == 0, "PAGE_SIZE must be a power of two"  # ok: FC109

# The first cascade level only ever holds the system prompt, which is capped by
# the tokenizer template, so its split-k scratch does not follow the batch.
CASCADE_WORKSPACE_BYTES = 128 * 1024 * 1024

DEFAULT_GRAPH_BATCH_SIZES: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


@dataclass
class EngineConfig:
    # model shape
    num_layers: int = 16
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    intermediate_size: int = 11008
    vocab_size: int = 32000
    rope_theta: float = 10000.0
    max_position: int = 32768
    dtype: torch.dtype = torch.bfloat16

    # sliding-window layers: every ``sliding_window_pattern``-th layer is global
    sliding_window: Optional[int] = None
    sliding_window_pattern: int = 4

    # KV pool and scheduler limits
    page_size: int = PAGE_SIZE
    num_pages: int = 16384
    max_batch_size: int = 64
    max_pages_per_seq: int = 512
    max_num_tokens: int = 8192
    chunked_prefill_size: int = 4096

    # attention backend
    attention_backend: str = "flashinfer_graph"
    shared_prefix_tokens: int = 0
    enable_cuda_graph: bool = True
    graph_batch_sizes: List[int] = field(default_factory=lambda: list(DEFAULT_GRAPH_BATCH_SIZES))
    graph_workspace_bytes: int = 256 * 1024 * 1024
    trtllm_workspace_bytes: int = 128 * 1024 * 1024

    # speculative decoding
    num_draft_steps: int = 3

    def __post_init__(self) -> None:
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")
        if self.graph_batch_sizes != sorted(self.graph_batch_sizes):
            raise ValueError(f"graph_batch_sizes must be ascending, got {self.graph_batch_sizes}")
        if self.shared_prefix_tokens % self.page_size:
            raise ValueError(
                f"shared_prefix_tokens={self.shared_prefix_tokens} is not a multiple of page_size={self.page_size}"
            )

    def layer_window_left(self, layer_id: int) -> int:
        """``window_left`` FlashInfer expects for a layer (-1: global attention)."""
        if self.sliding_window is None:
            return -1
        if (layer_id + 1) % self.sliding_window_pattern == 0:
            return -1
        return self.sliding_window - 1

    def window_lefts(self) -> List[int]:
        return sorted({self.layer_window_left(i) for i in range(self.num_layers)})

    def _split_kv_bytes(self, tokens: int, chunks: int) -> int:
        # partial outputs (fp32) and their log-sum-exp for ``chunks`` KV splits per row
        return tokens * self.num_qo_heads * (self.head_dim * 4 + 4) * chunks

    def workspace_bytes(self) -> int:
        """Float workspace of the eager wrappers, sized for the largest step the scheduler forms."""
        tokens = max(self.max_num_tokens, self.chunked_prefill_size, self.max_batch_size)
        return 16 * 1024 * 1024 + self._split_kv_bytes(tokens, chunks=4)

    def window_workspace_bytes(self) -> int:
        """Decode-only wrapper: one query row per request, windows bound the splits."""
        return 8 * 1024 * 1024 + self._split_kv_bytes(self.max_batch_size, chunks=16)

    def draft(self, num_layers: int = 2) -> "EngineConfig":
        """Configuration of the draft model: same attention shape, fewer layers, no shared prompt."""
        return dataclasses.replace(
            self,
            num_layers=num_layers,
            attention_backend="draft",
            shared_prefix_tokens=0,
        )
