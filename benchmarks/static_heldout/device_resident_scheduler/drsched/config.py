from __future__ import annotations

import dataclasses
from typing import Tuple

# Workspace of the graph-mode decode wrappers.  The buckets top out at 128 rows, so one size was
# picked for all of them when the engine only served 4k contexts.
DECODE_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass
class SchedConfig:
    max_running: int = 256
    queue_capacity: int = 4096
    admit_window: int = 64
    num_pages: int = 65536
    page_size: int = 16
    low_watermark_pages: int = 2048
    num_layers: int = 24
    hidden_size: int = 4096
    vocab_size: int = 32000
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    max_prefill_tokens: int = 8192
    max_pages_per_req: int = 512
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    trtllm_min_context: int = 16384
    eos_token_id: int = 2
    # scratch of the shared-prefix decode wrapper; the launcher overrides it per model
    prefix_workspace_bytes: int = 128 * 1024 * 1024

    @property
    def max_graph_bs(self) -> int:
        return max(self.graph_buckets)

    def prefill_workspace_bytes(self) -> int:
        # split-k partial outputs (fp32) and their LSE for every prefill token and head
        per_token = self.num_qo_heads * (self.head_dim * 4 + 4)
        return 2 * self.max_prefill_tokens * per_token + (16 << 20)

    def trtllm_workspace_bytes(self) -> int:
        # multi-CTA reduction scratch: partial outputs per running row, plus counters
        per_row = self.num_qo_heads * (self.head_dim * 4 + 8) * 4
        return self.max_running * per_row + (8 << 20)

    def bucket_for(self, rows: int):
        for bs in self.graph_buckets:
            if bs >= rows:
                return bs
        return None
