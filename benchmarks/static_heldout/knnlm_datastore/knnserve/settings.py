from __future__ import annotations

import os
from dataclasses import dataclass

# graph-mode decode workspace, MiB (operators override it per deployment)
DECODE_WS_MB = int(os.environ.get("KNN_DECODE_WS_MB", "256"))


@dataclass
class KnnServeSettings:
    max_batch: int = 96
    buckets: tuple = (1, 2, 4, 8, 16, 32, 64)
    page_size: int = 16
    num_pages: int = 32768
    max_pages_per_req: int = 256
    page_headroom: int = 4096
    max_prefill_tokens: int = 8192
    num_layers: int = 16
    num_qo_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 64
    hidden_size: int = 1024
    vocab_size: int = 50272
    knn_k: int = 32
    nprobe: int = 8
    temperature: float = 10.0
    lmbda: float = 0.25
    max_dist: float = 1.0e4
    near_dist: float = 1.0
    eager_workspace_bytes: int = 192 << 20
    use_trtllm_overflow: bool = True

    @property
    def max_context(self) -> int:
        return self.max_pages_per_req * self.page_size

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2

    def trtllm_workspace_bytes(self) -> int:
        splits = max(1, self.max_context // 512)
        return self.max_batch * self.num_qo_heads * splits * (self.head_dim + 1) * 4
