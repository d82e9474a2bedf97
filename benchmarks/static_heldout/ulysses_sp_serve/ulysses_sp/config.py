from __future__ import annotations

from dataclasses import dataclass, field

# Bytes for the FlashInfer workspace shared by the decode CUDA graphs.
DECODE_GRAPH_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class SPConfig:
    sp_size: int
    sp_rank: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    num_layers: int
    page_size: int = 16
    max_batch_size: int = 64
    max_prefill_tokens: int = 131072
    max_extend_tokens: int = 512
    max_context_len: int = 1 << 20
    max_pages: int = 1 << 17
    graph_buckets: tuple = (1, 2, 4, 8, 16, 32, 64)
    extend_buckets: tuple = ((1, 64), (4, 64), (8, 32))
    sm_version: int = 90
    kv_dtype: str = "bfloat16"
    extra: dict = field(default_factory=dict)

    @property
    def local_heads(self) -> int:
        return self.num_heads // self.sp_size

    @property
    def local_kv_heads(self) -> int:
        return max(1, self.num_kv_heads // self.sp_size)
