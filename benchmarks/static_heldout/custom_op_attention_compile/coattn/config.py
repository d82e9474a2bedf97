from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

# megabytes of the full-decode graphs' workspace; operators raise it for long-context models
GRAPH_WS_ENV = "COATTN_GRAPH_WS_MB"


@dataclasses.dataclass
class CompileServeConfig:
    num_layers: int = 28
    hidden_size: int = 3584
    intermediate_size: int = 18944
    vocab_size: int = 152064
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    rope_theta: float = 1000000.0
    page_size: int = 16
    num_pages: int = 40000
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    sliding_window: Optional[int] = 4096
    window_every: int = 2  # every second layer uses the sliding window
    full_graph_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    piecewise_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    use_trtllm_decode: bool = False

    @property
    def max_blocks_per_seq(self) -> int:
        return (self.max_model_len + self.page_size - 1) // self.page_size

    def is_window_layer(self, idx: int) -> bool:
        return self.sliding_window is not None and idx % self.window_every == 1

    def prefill_workspace_bytes_for(self, max_tokens: int) -> int:
        return 2 * max_tokens * self.num_qo_heads * (self.head_dim * 4 + 4) + (32 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.prefill_workspace_bytes_for(self.max_num_batched_tokens)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_num_seqs * self.num_qo_heads * (self.head_dim * 4 + 8) * 4 + (8 << 20)

    def window_workspace_bytes(self) -> int:
        return self.max_num_seqs * self.num_qo_heads * (self.head_dim * 4 + 8) * 2 + (8 << 20)

    def full_graph_size_for(self, num_decodes: int) -> Optional[int]:
        for s in self.full_graph_sizes:
            if s >= num_decodes:
                return s
        return None

    def piecewise_size_for(self, num_tokens: int) -> Optional[int]:
        for s in self.piecewise_sizes:
            if s >= num_tokens:
                return s
        return None
