"""Mixture-of-experts layer; routing and the expert GEMMs are delegated to its quant method."""

from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from qserve.layers.linear import divide, get_tensor_model_parallel_world_size, tensor_model_parallel_all_reduce
from qserve.layers.quantization.base_config import (
    FusedMoEMethodBase,
    QuantizationConfig,
    QuantizeMethodBase,
    frozen_param,
)


def fused_topk(hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int,
               renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.softmax(gating_output.to(torch.float32), dim=-1)
    topk_weights, topk_ids = torch.topk(scores, topk, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)


def dense_moe_forward(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, experts: Iterable[int], out: torch.Tensor) -> torch.Tensor:
    """Reference expert loop: each listed expert runs on every token, weighted by its routing weight."""
    out.zero_()
    for expert in experts:
        gate_up = x @ w13[expert].t()
        d = gate_up.shape[-1] // 2
        hidden = (F.silu(gate_up[..., :d]) * gate_up[..., d:]) @ w2[expert].t()
        weight = (topk_weights * (topk_ids == expert)).sum(dim=-1, keepdim=True)
        out += hidden * weight.to(hidden.dtype)
    return out


class UnquantizedFusedMoEMethod(FusedMoEMethodBase):
    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype, **extra):
        inter = intermediate_size_per_partition
        layer.w13_weight = frozen_param(
            torch.empty(num_experts, 2 * inter, hidden_size, dtype=params_dtype, device=layer.device))
        layer.w2_weight = frozen_param(
            torch.empty(num_experts, hidden_size, inter, dtype=params_dtype, device=layer.device))

    def apply(self, layer, x, router_logits, top_k, renormalize):
        topk_weights, topk_ids = fused_topk(x, router_logits, top_k, renormalize)
        # Skip the experts no token was routed to.
        tokens_per_expert = torch.bincount(topk_ids.view(-1), minlength=layer.num_experts).cpu()  # ok: FC101
        experts = [e for e in range(layer.num_experts) if tokens_per_expert[e] > 0]
        return dense_moe_forward(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids, experts,
                                 torch.empty_like(x))


class FusedMoE(nn.Module):
    """Experts sharded over tensor-parallel ranks along the intermediate dimension."""

    quant_method: Optional[QuantizeMethodBase]

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 params_dtype: Optional[torch.dtype] = None, reduce_results: bool = False, renormalize: bool = True,
                 quant_config: Optional[QuantizationConfig] = None, prefix: str = "",
                 device: torch.device | str = "cuda") -> None:
        super().__init__()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.num_experts = num_experts
        self.top_k = top_k
        self.intermediate_size_per_partition = divide(intermediate_size, self.tp_size)
        self.reduce_results = reduce_results
        self.renormalize = renormalize
        self.prefix = prefix
        self.device = torch.device(device)
        # Global expert id -> local id on this rank (-1: remote); identity without expert parallelism.
        self.expert_map = torch.arange(num_experts, dtype=torch.int32, device=self.device)
        if quant_config is None:
            self.quant_method = UnquantizedFusedMoEMethod()
        else:
            self.quant_method = quant_config.get_quant_method(self, prefix)
        if self.quant_method is None:
            raise ValueError(f"{type(quant_config).__name__} has no method for the MoE layer {prefix}")
        self.quant_method.create_weights(self, num_experts, hidden_size, self.intermediate_size_per_partition,
                                         params_dtype or torch.get_default_dtype())

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        out = self.quant_method.apply(self, hidden_states, router_logits, self.top_k, self.renormalize)
        if self.reduce_results and self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out
