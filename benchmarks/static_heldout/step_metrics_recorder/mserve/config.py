from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

# Decode wrappers (eager and every captured bucket) share one float workspace.
WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass
class EngineConfig:
    vocab_size: int = 32000
    hidden_size: int = 4096
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 32768
    max_running_requests: int = 256
    max_pages_per_request: int = 512
    max_prefill_tokens: int = 16384
    cuda_graph_batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
    record_dir: Optional[str] = None
    record_every: int = 1
    shadow_eager: bool = False
    metrics_port: int = 9400
    dtype: str = "bfloat16"

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_heads * (self.head_dim + 1) * 4 * 2 + (64 << 20)
