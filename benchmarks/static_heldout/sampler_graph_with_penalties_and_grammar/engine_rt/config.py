"""Engine configuration for a decode worker with captured sampling."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class EngineConfig:
    hidden_size: int = 2304
    num_layers: int = 26
    num_qo_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 256
    intermediate_size: int = 9216
    vocab_size: int = 256000
    page_size: int = 16
    num_pages: int = 32768
    max_batch: int = 128
    max_slots: int = 1024
    max_model_len: int = 8192
    long_context_threshold: int = 4096
    attn_softcap: float = 50.0
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    dtype: torch.dtype = torch.bfloat16

    @property
    def sm_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def is_softcap_layer(self, layer_id: int) -> bool:
        # local sliding-window layers (every other one) cap their attention logits
        return layer_id % 2 == 0

    def max_pages_per_batch(self) -> int:
        return self.max_batch * (self.max_model_len // self.page_size + 1)

    def eager_workspace_bytes(self) -> int:
        chunks = max(1, self.max_model_len // 1024)
        return self.max_batch * self.num_qo_heads * (self.head_dim + 1) * 4 * chunks + (8 << 20)

    def trtllm_ws_bytes(self) -> int:
        return self.max_batch * self.num_qo_heads * 8192 + (16 << 20)
