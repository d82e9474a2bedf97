from __future__ import annotations

import dataclasses
from typing import Tuple

# Fixed scratch for the wrappers that are not sized by the batch (measured once on an 8-GPU node).
_WS_BYTES = {
    "prefill": lambda: 384 << 20,
    "sink": lambda: 32 << 20,
}


@dataclasses.dataclass
class OffloadConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    page_size: int = 16
    sink_pages: int = 1
    window_pages: int = 128
    gpu_pages: int = 32768
    host_pages: int = 1 << 20
    max_batch: int = 32
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    cpu_chunk_tokens: int = 8192
    use_trtllm_eager: bool = True

    @property
    def max_bucket(self) -> int:
        return max(self.graph_buckets)

    @property
    def gpu_pages_per_req(self) -> int:
        return self.sink_pages + self.window_pages + 1

    def gpu_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * 16 + (16 << 20)
