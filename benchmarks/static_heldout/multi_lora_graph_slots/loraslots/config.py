"""Static limits of the multi-LoRA server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

# Ragged prefill of newly admitted prompts; picked once for the benchmark prompt lengths.
PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class SlotConfig:
    """Engine limits. Slot 0 of every graph is the zero adapter (rows that run the base model)."""

    num_slots: int = 8
    max_rank: int = 64
    vocab_size: int = 32000
    hidden_size: int = 4096
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_pages: int = 65536
    max_batch: int = 256
    max_context: int = 32768
    max_prefill_tokens: int = 8192
    use_trtllm: bool = False
    graph_buckets: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64))

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    @property
    def pages_per_seq(self) -> int:
        return (self.max_context + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self) -> int:
        # split-k partial outputs and LSEs for every (request, head, split), plus the planner's int area
        splits = max(1, self.max_context // 2048)
        partial = self.max_batch * self.num_qo_heads * splits * (self.head_dim + 1) * 4
        return partial + 16 * self.max_batch * self.num_qo_heads

    def trtllm_workspace_bytes(self) -> int:
        # multi-CTA counters and partials of the trtllm-gen decode kernel for the largest eager batch
        return self.max_batch * self.num_qo_heads * (self.head_dim + 2) * 4 * 16
