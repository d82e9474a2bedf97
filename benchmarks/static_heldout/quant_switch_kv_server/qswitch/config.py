"""Server configuration and workspace sizing."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Tuple

from qswitch.dtypes import KVClass

# Paged prefill scratch; overridable per deployment.
PREFILL_WS_BYTES = int(os.environ.get("QSWITCH_PREFILL_WS_BYTES", 256 << 20))


@dataclass
class SwitchConfig:
    num_layers: int = 40
    vocab_size: int = 151936
    hidden_size: int = 5120
    num_q_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_requests: int = 512
    max_pages_per_req: int = 2048
    max_seq_len: int = 32768
    bf16_pages: int = 16384
    fp8_pages: int = 65536
    graph_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    # layers whose keys overflow e4m3 are kept in a bf16 side pool even for FP8 requests
    fp8_outlier_layers: Tuple[int, ...] = field(default_factory=tuple)
    max_scale: float = 448.0

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_batch_sizes)

    def workspace_bytes(self, kv_class: KVClass) -> int:
        # split-k partials for the largest eager batch; XQA keeps its counters at the front
        per_row = self.num_q_heads * (self.head_dim + 1) * 4 * 32
        scale = 2 if kv_class is KVClass.FP8 else 1
        return self.max_requests * per_row * scale

    def graph_ws_bytes(self) -> int:
        return self.max_graph_bs * self.num_q_heads * (self.head_dim + 1) * 4 * 64

    def trtllm_ws_bytes(self) -> int:
        return self.max_requests * self.num_q_heads * self.head_dim * 8
