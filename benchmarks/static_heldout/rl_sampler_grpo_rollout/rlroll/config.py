from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

import torch


@dataclass
class PolicyShape:
    num_layers: int = 28
    hidden_size: int = 3584
    num_qo_heads: int = 28
    num_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 152064
    dtype: torch.dtype = torch.bfloat16


@dataclass
class RolloutConfig:
    n_samples: int = 8
    max_samples_per_prompt: int = 64
    max_prompts: int = 64
    max_prompt_len: int = 2048
    max_new_tokens: int = 4096
    temperature: float = 1.0
    eos_id: int = 151643
    page_size: int = 16
    num_pages: int = 131072
    cascade_min_prefix: int = 256
    graph_buckets: Tuple[int, ...] = field(default=(8, 16, 32, 64, 128, 256))

    @property
    def max_running(self) -> int:
        return self.max_prompts * self.n_samples

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_prompt_len + self.max_new_tokens + self.page_size - 1) // self.page_size

    def cascade_workspace_bytes(self, shape: PolicyShape) -> int:
        # split-k partials for every running sample at both cascade levels
        return 2 * self.max_running * shape.num_qo_heads * (shape.head_dim + 1) * 4 * 8 + (32 << 20)

    def trtllm_workspace_bytes(self, shape: PolicyShape) -> int:
        return self.max_prompts * self.max_prompt_len * shape.num_qo_heads * 8 + (16 << 20)
