"""RadixAttention; under torch.compile the call goes through a custom op that splits the FX graph."""

from __future__ import annotations

import torch
from torch import nn

from sgl_pw.compilation.compile import is_compiled
from sgl_pw.forward_context import get_forward_context


@torch.library.custom_op("sglang::unified_attention_with_output", mutates_args=("output",))
def unified_attention_with_output(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, layer_id: int
) -> None:
    context = get_forward_context()
    forward_batch = context.forward_batch
    layer = context.attention_layers[layer_id]
    ret = forward_batch.attn_backend.forward(query, key, value, layer, forward_batch)
    output.view(ret.shape).copy_(ret)


@unified_attention_with_output.register_fake
def _(query, key, value, output, layer_id) -> None:
    return None


class RadixAttention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, scaling: float, num_kv_heads: int, layer_id: int, logit_cap: float = 0.0):
        super().__init__()
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.tp_v_head_num = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.layer_id = layer_id
        self.logit_cap = logit_cap
        self.is_cross_attention = False

    def forward(self, q, k, v, forward_batch, save_kv_cache: bool = True):
        if is_compiled() and forward_batch.forward_mode.is_extend():
            output = torch.empty_like(q)
            unified_attention_with_output(q, k, v, output, self.layer_id)
            return output
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache)
