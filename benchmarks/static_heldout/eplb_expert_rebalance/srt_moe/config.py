"""Model and server configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import torch


class _GlobalConfig:
    """Process-wide knobs (SGLang keeps the same object)."""

    def __init__(self) -> None:
        self.flashinfer_workspace_size = 384 * 1024 * 1024
        self.eplb_window_steps = 200
        self.eplb_rebalance_every = 1000


global_config = _GlobalConfig()


@dataclass
class MoEModelConfig:
    vocab_size: int = 102400
    hidden_size: int = 2048
    num_layers: int = 16
    num_heads: int = 16
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    kv_lora_rank: int = 512
    num_experts: int = 64
    num_physical_experts: int = 80  # 16 redundant slots
    ep_size: int = 8
    top_k: int = 6
    moe_intermediate_size: int = 1408
    capacity_factor: float = 1.25
    page_size: int = 64
    max_pages_per_seq: int = 256
    max_running_requests: int = 128
    max_extend_tokens: int = 8192
    cuda_graph_bs: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 96, 128])
    dtype: torch.dtype = torch.bfloat16

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim
