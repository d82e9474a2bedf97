"""Engine configuration: which attention plugin serves which layer type."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

PAGE_SIZE = 16
GRAPH_BATCH_SIZES: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
GRAPH_WORKSPACE_BYTES = 96 * 1024 * 1024  # split-k scratch of the bucket decode wrappers, measured on the 8B model
PLUGIN_PACKAGE = "peab_plugins"
LAYER_FULL = "full"
LAYER_SLIDING = "sliding"


@dataclasses.dataclass
class EngineConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = PAGE_SIZE
    num_pages: int = 65536
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_model_len: int = 32768
    sliding_window: int = 4096
    full_every: int = 4  # every full_every-th layer attends to the whole context, the others to the window
    layer_backends: Dict[str, str] = dataclasses.field(default_factory=lambda: {"full": "fi_paged", "sliding": "fi_window"})
    graph_batch_sizes: Tuple[int, ...] = GRAPH_BATCH_SIZES
    enable_cuda_graphs: bool = True
    attention_sinks: bool = False
    shared_prefix_len: int = 0
    graph_workspace_bytes: int = 256 * 1024 * 1024
    eos_token_id: int = 128001

    def layer_types(self) -> List[str]:
        return [LAYER_FULL if i % self.full_every == self.full_every - 1 else LAYER_SLIDING for i in range(self.num_layers)]

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_model_len + self.page_size - 1) // self.page_size

    def workspace_bytes(self) -> int:
        # split-k partial outputs (fp32 per token and head) plus the planner's index arrays
        rows = max(self.max_num_tokens, self.max_batch_size * 16)
        return rows * self.num_qo_heads * self.head_dim * 4 + (32 << 20)
