"""Configuration of the router, the prefill workers and the decode pool."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Tuple

# FlashInfer's planner state; the name and type moved between releases (a tensor, then a list of ints).
PLAN_STATE_ATTR = "_plan_info"


@dataclass
class ModelDims:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    # layers attended through a sliding window (gpt-oss style alternation)
    window_layers: Tuple[int, ...] = ()
    sliding_window: int = 4096
    rms_eps: float = 1e-6

    @property
    def hidden_size(self) -> int:
        return self.num_qo_heads * self.head_dim


@dataclass
class PDConfig:
    model: ModelDims = field(default_factory=ModelDims)
    page_size: int = 16
    num_pages: int = 8192
    max_decode_batch: int = 256
    max_pages_per_seq: int = 2048
    max_prefill_tokens: int = 16384
    graph_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    decode_workspace_bytes: int = 256 * 1024 * 1024
    transport: str = "local"
    long_context_threshold: int = 32768
    eos_token_id: int = 2

    def trtllm_workspace_bytes(self) -> int:
        """Multi-CTA counters and partial outputs of trtllm-gen decode for the largest batch."""
        m = self.model
        return self.max_decode_batch * m.num_qo_heads * m.head_dim * 4 * 16 + (1 << 20)

    def ragged_workspace_bytes(self) -> int:
        m = self.model
        return self.max_prefill_tokens * m.num_qo_heads * m.head_dim * 4 * 2
