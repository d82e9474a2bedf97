"""Engine configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

import torch


@dataclass
class EngineConfig:
    model_path: str
    num_layers: int = 24
    hidden_size: int = 2048
    num_qo_heads: int = 16
    num_kv_heads: int = 4
    head_dim: int = 128
    intermediate_size: int = 5632
    vocab_size: int = 32000
    rope_theta: float = 10000.0
    dtype: torch.dtype = torch.bfloat16

    # paged KV cache
    page_size: int = 16
    num_pages: int = 65536
    max_running_requests: int = 512
    max_context_len: int = 32768

    # per-step limits
    max_batch_size: int = 256
    max_num_tokens: int = 8192

    # attention features
    sliding_window: int = 4096
    window_layers: Tuple[int, ...] = ()
    logit_cap: float = 0.0
    # "auto" | "fa2" | "trtllm" (trtllm-gen decode wrapper) | "trtllm-raw" (raw kernel)
    decode_backend: str = "auto"
    use_tensor_cores: bool = True

    # FA2 window wrapper workspace; a configuration value, overridable per deployment
    window_workspace_bytes: int = 128 * 1024 * 1024

    # CUDA graphs
    disable_cuda_graph: bool = False
    cuda_graph_bs: Tuple[int, ...] = field(default_factory=lambda: (1, 2, 4, 8, 16, 32, 64, 128))

    device: str = "cuda"

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    def decode_workspace_bytes(self) -> int:
        """Split-k partial outputs and LSEs for the largest decode batch, plus the plan info."""
        per_split = self.max_batch_size * self.num_qo_heads * (self.head_dim + 1) * 4
        max_splits = max(1, self.max_context_len // 512)
        return per_split * max_splits + (16 << 20)

    def prefill_tokens_bound(self) -> int:
        return max(self.max_num_tokens, self.max_batch_size)
