"""Limits shared by the primary and the standby."""

from dataclasses import dataclass, field
from typing import List

import torch


@dataclass
class ReplicaConfig:
    vocab_size: int = 128_256
    hidden_size: int = 4096
    intermediate_size: int = 14_336
    num_layers: int = 4
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 128
    max_pages: int = 49_152
    max_pages_per_seq: int = 2048
    max_prefill_tokens: int = 8192
    decode_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])
    sync_every: int = 4
    full_sync_every: int = 8
    verify_mirror: bool = False
    trtllm_workspace_bytes: int = 256 << 20
    primary_device: torch.device = field(default_factory=lambda: torch.device("cuda", 0))
    standby_device: torch.device = field(default_factory=lambda: torch.device("cuda", 1))

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 + (16 << 20)

    def eager_workspace_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * 32 + (8 << 20)
