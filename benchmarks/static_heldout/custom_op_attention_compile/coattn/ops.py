"""The attention custom ops.  ``torch.compile`` treats them as opaque (the fake implementations
give it shapes); the piecewise backend splits the graph at them."""

from __future__ import annotations

import torch

from coattn.forward_context import get_forward_context


@torch.library.custom_op("coattn::unified_attention", mutates_args=("output",))
def unified_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, layer_name: str
) -> None:
    ctx = get_forward_context()
    impl = ctx.attn_impls[layer_name]
    impl.forward_mixed(query, key, value, output, ctx.attn_metadata)


@unified_attention.register_fake
def _unified_attention_fake(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, layer_name: str
) -> None:
    assert output.shape[0] >= query.shape[0], "output must cover every query row"  # ok: FC109
    return None


@torch.library.custom_op("coattn::unified_decode_attention", mutates_args=("output",))
def unified_decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, layer_name: str
) -> None:
    ctx = get_forward_context()
    ctx.attn_impls[layer_name].forward_decode(query, key, value, output, ctx.attn_metadata)


@unified_decode_attention.register_fake
def _unified_decode_attention_fake(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor, layer_name: str
) -> None:
    return None


ATTENTION_OPS = (torch.ops.coattn.unified_attention.default, torch.ops.coattn.unified_decode_attention.default)
