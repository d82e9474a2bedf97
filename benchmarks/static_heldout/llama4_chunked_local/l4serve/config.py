"""Model shape and engine limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class Llama4Config:
    num_layers: int = 48
    hidden_size: int = 5120
    num_qo_heads: int = 40
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 202048
    attn_chunk_size: int = 8192  # local layers attend inside their 8k chunk only
    nope_layer_interval: int = 4  # every 4th layer is global and uses no RoPE
    block_size: int = 16
    max_num_blocks: int = 262144
    max_num_reqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 1048576
    cudagraph_batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    use_trtllm_attention: bool = False
    kv_layout: str = "HND"
    dtype: torch.dtype = torch.bfloat16

    def is_local_layer(self, layer_idx: int) -> bool:
        return (layer_idx + 1) % self.nope_layer_interval != 0

    @property
    def max_blocks_per_req(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @property
    def pages_per_chunk(self) -> int:
        return self.attn_chunk_size // self.block_size

    def _partial_bytes(self, rows: int) -> int:
        return rows * self.num_qo_heads * (self.head_dim + 1) * 4

    def workspace_bytes(self) -> int:
        return 2 * self._partial_bytes(self.max_num_batched_tokens) + (32 << 20)

    def graph_workspace_bytes(self) -> int:
        return 16 * self._partial_bytes(self.cudagraph_batch_sizes[-1]) + (8 << 20)

    def virtual_workspace_bytes(self) -> int:
        # a step splits into at most one virtual batch per request plus one per crossed chunk boundary
        max_virtual = 2 * self.max_num_reqs + self.max_num_batched_tokens // self.attn_chunk_size
        return 2 * self._partial_bytes(self.max_num_batched_tokens + max_virtual) + (8 << 20)
