"""Engine configuration and the sizes derived from it."""

from dataclasses import dataclass
from typing import Optional

import torch

# Split-kv scratch for the eager decode wrappers.
DECODE_WORKSPACE_BYTES = 256 * 1024 * 1024


@dataclass
class EngineConfig:
    vocab_size: int = 128256
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_layers: int = 32
    num_attention_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    # Gemma-2 style: every other layer attends within a window when set.
    sliding_window: Optional[int] = None

    page_size: int = 16
    num_pages: int = 32768
    max_num_reqs: int = 256
    max_context_len: int = 8192
    chunked_prefill_size: int = 8192

    dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype = torch.bfloat16
    decode_backend: str = "fa2"  # "fa2" or "trtllm-gen" (Blackwell)

    cuda_graph_max_bs: int = 160
    max_top_logprobs: int = 5
    penalty_history: int = 64
    gpu_id: int = 0

    @property
    def max_pages_per_req(self) -> int:
        return (self.max_context_len + self.page_size - 1) // self.page_size

    def prefill_workspace_bytes(self) -> int:
        # Partial outputs of split-kv prefill: one fp32 row per (token, head) and chunk, plus the
        # planner's int buffers.
        per_token = self.num_attention_heads * (self.head_dim + 1) * 4
        return max(2 * self.chunked_prefill_size * per_token, 64 << 20)

    def graph_workspace_bytes(self) -> int:
        per_req = self.num_attention_heads * (self.head_dim + 1) * 4 * 16
        return max(self.cuda_graph_max_bs * per_req, 32 << 20)

    def trtllm_workspace_bytes(self) -> int:
        # Multi-CTA counters and partial results of the trtllm-gen decode kernel.
        return self.max_num_reqs * self.num_attention_heads * self.head_dim * 4 * 8
