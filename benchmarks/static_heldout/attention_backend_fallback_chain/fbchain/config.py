from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple

import torch


@dataclass
class ChainConfig:
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    num_pages: int = 65536
    max_num_seqs: int = 256
    max_num_tokens: int = 8192
    max_model_len: int = 131072
    max_splits: int = 16
    window: int = 4096
    window_layers: Tuple[int, ...] = ()
    dtype: torch.dtype = torch.bfloat16
    graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    chain: Tuple[str, ...] = field(default_factory=lambda: ("trtllm-gen", "fa2", "torch"))
    trtllm_prefill: bool = False

    def fa2_workspace_bytes(self) -> int:
        rows = self.max_num_tokens * self.num_qo_heads
        return max(rows * self.max_splits * (self.head_dim + 1) * 4, 64 << 20)

    def trtllm_workspace_bytes(self) -> int:
        return self.max_num_seqs * self.num_qo_heads * self.max_splits * (self.head_dim + 2) * 4


def graph_workspace_bytes() -> int:
    # what the FA2 decode planner asked for at bs=256, 32k tokens, rounded up
    return 256 * 1024 * 1024
