"""Engine, model-shape and scheduler configuration."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

PAGE_SIZE = 16

# graph decode workspace, sized once by hand for the 8B model we benchmarked
DECODE_WORKSPACE_BYTES = 256 * 1024 * 1024

GRAPH_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class ModelShape:
    num_layers: int = 32
    hidden_size: int = 4096
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    dtype: torch.dtype = torch.bfloat16

    @property
    def sm_scale(self) -> float:
        return self.head_dim ** -0.5


@dataclass
class SchedulerConfig:
    """Every step carries at most ``token_budget`` tokens: decodes first, then prompt chunks."""

    token_budget: int = 512
    chunk_size: int = 256
    max_num_seqs: int = 128
    max_model_len: int = 8192
    num_pages: int = 65536
    page_size: int = PAGE_SIZE
    trtllm_decode_above: int = 96
    hybrid_budgets: Tuple[int, ...] = (256, 512)

    @property
    def max_pages_per_seq(self) -> int:
        return (self.max_model_len + self.page_size - 1) // self.page_size

    def prefill_workspace_bytes(self, shape: ModelShape) -> int:
        # split-k partial outputs grow with the tokens a step may carry
        per_token = shape.num_qo_heads * (shape.head_dim + 1) * 4
        return self.token_budget * per_token * 4 + (32 << 20)

    def eager_decode_workspace_bytes(self, shape: ModelShape) -> int:
        per_seq = shape.num_qo_heads * (shape.head_dim + 1) * 4 * 16
        return self.max_num_seqs * per_seq + (16 << 20)

    def trtllm_workspace_bytes(self, shape: ModelShape) -> int:
        return self.max_num_seqs * shape.num_qo_heads * 4096 + (8 << 20)
