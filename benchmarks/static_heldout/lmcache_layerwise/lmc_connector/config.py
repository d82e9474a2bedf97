from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class EngineLimits:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    num_blocks: int = 32768
    num_spec_tokens: int = 0
    cudagraph_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])

    def prefill_workspace_bytes(self) -> int:
        # ragged/paged prefill: per-token partial outputs for up to 8 KV splits + planner ints
        per_token = self.num_qo_heads * (self.head_dim + 1) * 4
        return self.max_num_batched_tokens * per_token * 8 + (self.max_num_seqs + 1) * 4096


@dataclass
class ConnectorConfig:
    chunk_size: int = 256
    host_capacity_bytes: int = 64 << 30
    save_decode_cache: bool = False
    local_cpu: bool = True
