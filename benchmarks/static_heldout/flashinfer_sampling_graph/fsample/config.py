"""Limits of the sampling engine."""

import enum
from dataclasses import dataclass, field
from typing import List

import torch


class WsTier(enum.Enum):
    """Workspace tiers in MiB, picked by deployment size."""

    SMALL = 64
    LARGE = 256

    def nbytes(self) -> int:
        return self.value << 20


@dataclass
class SamplingEngineConfig:
    vocab_size: int = 128_256
    hidden_size: int = 2048
    intermediate_size: int = 8192
    num_layers: int = 4
    window_layers: List[int] = field(default_factory=lambda: [1, 3])
    sliding_window: int = 4096
    num_qo_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_batch: int = 64  # requests per step
    max_samples_per_request: int = 4
    initial_requests: int = 16
    max_pages: int = 65_536
    max_prefill_tokens: int = 8192
    decode_buckets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    async_output: bool = True
    use_trtllm_prefill: bool = True
    device: torch.device = field(default_factory=lambda: torch.device("cuda", 0))

    @property
    def max_rows(self) -> int:
        return self.max_batch * self.max_samples_per_request

    def graph_workspace_bytes(self) -> int:
        rows = self.decode_buckets[-1] * self.num_qo_heads
        return rows * (self.head_dim + 1) * 4 * 16 + (8 << 20)

    def prefill_workspace_bytes(self) -> int:
        return self.max_prefill_tokens * self.num_qo_heads * (self.head_dim + 1) * 4 * 2 + (32 << 20)
