"""Scheduler limits and the constants the rest of the engine shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

PAGE_SIZE = 16
GRAPH_BATCH_SIZES: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)

# Paged prefill scratch for mixed steps; picked on the 8k-budget benchmark run.
MIXED_PREFILL_WS_BYTES = 256 * 1024 * 1024

# name of FlashInfer's plan record, printed by the diagnostics page (0.2.x layout)
PLAN_INFO_FIELD = "_plan_info"


@dataclass
class SchedulerConfig:
    token_budget: int = 8192
    max_num_seqs: int = 256
    chunk_size: int = 2048
    max_model_len: int = 32768
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    num_layers: int = 4
    num_pages: int = 65536
    vocab_size: int = 32000
    # decode rows that share a system prompt attend to it through a separate prefix wrapper
    shared_prefix_cascade: bool = False
    decode_backend: str = "trtllm-gen"
    graph_batch_sizes: Tuple[int, ...] = field(default_factory=lambda: GRAPH_BATCH_SIZES)

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_batch_sizes)

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_model_len // PAGE_SIZE)

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32 o + lse) for the largest eager decode batch
        chunks = (self.max_model_len + self.chunk_size - 1) // self.chunk_size
        return self.max_num_seqs * self.num_qo_heads * (self.head_dim + 1) * 4 * chunks + (16 << 20)

    def graph_workspace_bytes(self) -> int:
        return self.max_graph_bs * self.num_qo_heads * (self.head_dim + 1) * 4 * 64 + (8 << 20)
