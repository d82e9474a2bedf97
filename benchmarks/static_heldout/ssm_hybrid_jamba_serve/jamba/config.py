"""Configuration of the Jamba-style hybrid server.

A Jamba block stack interleaves one attention layer into every ``attn_period``
layers (``attn_offset`` inside the period); every other layer is a Mamba layer
whose per-request state lives in :class:`jamba.mem.mamba_pool.MambaStatePool`.
"""
from __future__ import annotations

import dataclasses
from typing import List, Tuple

# Float workspace shared by the attention layers' decode wrappers (bytes).
ATTN_WORKSPACE_BYTES = 256 * 1024 * 1024

ATTN_LAYER_PERIOD = 8
ATTN_LAYER_OFFSET = 4

assert ATTN_LAYER_OFFSET < ATTN_LAYER_PERIOD  # ok: FC109


@dataclasses.dataclass
class JambaConfig:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 65536
    num_attention_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    num_experts: int = 16
    mamba_d_state: int = 16
    mamba_d_conv: int = 4
    mamba_expand: int = 2
    mamba_dt_rank: int = 256
    page_size: int = 16
    num_kv_pages: int = 65536
    max_num_reqs: int = 256
    max_context_len: int = 262144
    max_prefill_tokens: int = 16384
    cuda_graph_bs: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    attn_period: int = ATTN_LAYER_PERIOD
    attn_offset: int = ATTN_LAYER_OFFSET

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_expand * self.hidden_size

    def is_attention_layer(self, layer_id: int) -> bool:
        return layer_id % self.attn_period == self.attn_offset

    def attention_layer_ids(self) -> List[int]:
        return [i for i in range(self.num_layers) if self.is_attention_layer(i)]

    def mamba_layer_ids(self) -> List[int]:
        return [i for i in range(self.num_layers) if not self.is_attention_layer(i)]

    def prefill_workspace_bytes(self) -> int:
        # split-k partial outputs of the largest prefill chunk plus the planner's scratch
        return self.max_prefill_tokens * self.num_attention_heads * self.head_dim * 4 + (64 << 20)
