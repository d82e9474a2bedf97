"""Engine configuration read by every hop of the constructor chain."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Tuple

PAGE_SIZE = 16
GRAPH_BATCH_SIZES: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
PREFILL_WORKSPACE_BYTES = int(os.environ.get("CCBI_PREFILL_WS_MB", "384")) << 20


@dataclass
class EngineConfig:
    attention_backend: str = "flashinfer"
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    sliding_window: int = 0
    window_layers: Tuple[int, ...] = ()
    shared_prefix_len: int = 0
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_context_len: int = 32768
    num_pages: int = 65536
    enforce_eager: bool = False
    decode_workspace_bytes: int = 128 * 1024 * 1024
    graph_batch_sizes: Tuple[int, ...] = field(default_factory=lambda: GRAPH_BATCH_SIZES)

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_context_len + PAGE_SIZE - 1) // PAGE_SIZE

    def workspace_bytes(self) -> int:
        # split-k partial outputs: tokens x heads x head_dim x fp32, up to 8 chunks per request
        return max(self.max_num_tokens * self.num_qo_heads * self.head_dim * 4 * 8, 64 << 20)
