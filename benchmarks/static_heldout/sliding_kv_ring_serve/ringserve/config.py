"""Configuration of the ring-buffer KV server."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Tuple

# Scratch for the ragged prompt prefill. Picked when the longest prompt we served was 32k tokens.
WINDOW_WORKSPACE_BYTES = 256 * 1024 * 1024

assert WINDOW_WORKSPACE_BYTES % (1 << 20) == 0  # ok: FC109


@dataclass
class RingConfig:
    num_layers: int = 32
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    window: int = 4096  # sliding window of the local layers, in tokens
    max_requests: int = 256
    max_num_tokens: int = 8192
    graph_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
    # layers that attend to the whole sequence (Gemma-2 / Mistral-style interleaving)
    global_layers: Tuple[int, ...] = field(default_factory=lambda: (5, 11, 17, 23, 29))
    global_max_pages: int = 4096
    eos_token_id: int = 2
    attn_backend: str = "flashinfer"
    use_trtllm_for_large: bool = True
    rope_theta: float = 10000.0

    @property
    def window_pages(self) -> int:
        # one spare page so that the page being written never aliases the oldest page still read
        return math.ceil(self.window / self.page_size) + 1

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_batch_sizes)

    def graph_workspace_bytes(self) -> int:
        # split-k partial outputs and LSEs for the largest captured batch, one chunk per ring page at worst
        per_row = self.num_q_heads * self.window_pages * (self.head_dim + 1) * 4
        return max(32 << 20, self.max_graph_bs * per_row)

    def trtllm_workspace_bytes(self) -> int:
        # multi-CTA reduction scratch and counters for the largest eager batch
        return self.max_requests * self.num_q_heads * (self.head_dim + 2) * 4 * 4
