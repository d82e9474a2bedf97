"""FP8 (e4m3) weights with per-tensor scales, FP8 experts and an fp8 KV cache."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from qserve.layers.fused_moe import dense_moe_forward, fused_topk
from qserve.layers.quantization.base_config import (
    FP8_E4M3_MAX,
    BaseKVCacheMethod,
    FusedMoEMethodBase,
    LinearMethodBase,
    QuantizationConfig,
    QuantizeMethodBase,
    UnquantizedLinearMethod,
    frozen_param,
    is_layer_skipped,
)

ACTIVATION_SCHEMES = ("static", "dynamic")


def cutlass_fp8_supported() -> bool:
    if not torch.cuda.is_available():
        return False
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor >= 89


def scaled_fp8_quant(x: torch.Tensor, scale: Optional[torch.Tensor] = None,
                     use_per_token_if_dynamic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize to e4m3; without a scale one is computed from ``x`` (per tensor or per token)."""
    if scale is None:
        amax = x.abs().amax(dim=-1, keepdim=True) if use_per_token_if_dynamic else x.abs().amax()
        scale = amax.to(torch.float32).clamp(min=1e-12) / FP8_E4M3_MAX
    q = (x.to(torch.float32) / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


class Fp8Config(QuantizationConfig):
    def __init__(self, is_checkpoint_fp8_serialized: bool = False, activation_scheme: str = "dynamic",
                 ignored_layers: Optional[list[str]] = None) -> None:
        if activation_scheme not in ACTIVATION_SCHEMES:
            raise ValueError(f"unsupported activation scheme {activation_scheme!r}")
        self.is_checkpoint_fp8_serialized = is_checkpoint_fp8_serialized
        self.activation_scheme = activation_scheme
        self.ignored_layers = ignored_layers or []

    @classmethod
    def get_name(cls) -> str:
        return "fp8"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Fp8Config":
        return cls(
            is_checkpoint_fp8_serialized="fp8" in cls.get_from_keys(config, ["quant_method"]),
            activation_scheme=cls.get_from_keys(config, ["activation_scheme"], "dynamic"),
            ignored_layers=cls.get_from_keys(config, ["ignored_layers"], []),
        )

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[QuantizeMethodBase]:
        from qserve.attention.layer import Attention
        from qserve.layers.fused_moe import FusedMoE
        from qserve.layers.linear import LinearBase

        if isinstance(layer, LinearBase):
            if is_layer_skipped(prefix, self.ignored_layers):
                return UnquantizedLinearMethod()
            return Fp8LinearMethod(self)
        if isinstance(layer, FusedMoE):
            return Fp8MoEMethod(self)
        if isinstance(layer, Attention):
            return Fp8KVCacheMethod(self)
        return None


class Fp8LinearMethod(LinearMethodBase):
    """Per-tensor FP8 GEMM; activations are quantized with a static scale or per step."""

    def __init__(self, quant_config: Fp8Config):
        self.quant_config = quant_config
        self.cutlass_fp8_supported = cutlass_fp8_supported()
        self.use_per_token_if_dynamic = self.cutlass_fp8_supported and quant_config.activation_scheme == "dynamic"

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra):
        num_shards = len(output_partition_sizes)
        layer.logical_widths = output_partition_sizes
        weight_dtype = torch.float8_e4m3fn if self.quant_config.is_checkpoint_fp8_serialized else params_dtype
        layer.weight = frozen_param(
            torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=weight_dtype, device=layer.device),
            input_dim=1, output_dim=0)
        # One scale per fused shard (q/k/v, gate/up) until the shards are requantized.
        layer.weight_scale = frozen_param(torch.ones(num_shards, dtype=torch.float32, device=layer.device))
        layer.input_scale = None
        if self.quant_config.activation_scheme == "static":
            layer.input_scale = frozen_param(torch.ones(num_shards, dtype=torch.float32, device=layer.device))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if not self.quant_config.is_checkpoint_fp8_serialized:
            qweight, max_w_scale = scaled_fp8_quant(layer.weight.data)
        else:
            # Shards were quantized separately: requantize them all to the largest scale.
            max_w_scale = layer.weight_scale.max()
            qweight = layer.weight.data
            start = 0
            for idx, width in enumerate(layer.logical_widths):
                dequant = qweight[start : start + width].to(torch.float32) * layer.weight_scale[idx]
                qweight[start : start + width] = scaled_fp8_quant(dequant, max_w_scale)[0]
                start += width
        layer.weight = frozen_param(qweight.t())
        layer.weight_scale = frozen_param(max_w_scale)
        # The dequantizing fallback multiplies by a Python float.
        layer.weight_scale_float = max_w_scale.item()  # ok: FC101
        if layer.input_scale is not None:
            layer.input_scale = frozen_param(layer.input_scale.max())

    def apply(self, layer, x, bias=None):
        qinput, x_scale = scaled_fp8_quant(x, layer.input_scale, self.use_per_token_if_dynamic)
        if self.cutlass_fp8_supported:
            return torch._scaled_mm(qinput, layer.weight, scale_a=x_scale, scale_b=layer.weight_scale,
                                    out_dtype=x.dtype, bias=bias)
        # No FP8 GEMM on this GPU: dequantize and run the dense one.
        out = torch.mm(qinput.to(x.dtype), layer.weight.to(x.dtype))
        out = out * (x_scale.item() * layer.weight_scale_float)  # expect: FC101
        return out + bias if bias is not None else out


class Fp8MoEMethod(FusedMoEMethodBase):
    """FP8 experts with one scale per expert matrix."""

    def __init__(self, quant_config: Fp8Config):
        self.quant_config = quant_config
        self._out_buf: Optional[torch.Tensor] = None

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype, **extra):
        dtype = torch.float8_e4m3fn
        inter = intermediate_size_per_partition
        layer.w13_weight = frozen_param(torch.empty(num_experts, 2 * inter, hidden_size, dtype=dtype, device=layer.device))
        layer.w2_weight = frozen_param(torch.empty(num_experts, hidden_size, inter, dtype=dtype, device=layer.device))
        layer.w13_weight_scale = frozen_param(torch.ones(num_experts, dtype=torch.float32, device=layer.device))
        layer.w2_weight_scale = frozen_param(torch.ones(num_experts, dtype=torch.float32, device=layer.device))

    def apply(self, layer, x, router_logits, top_k, renormalize):
        topk_weights, topk_ids = fused_topk(x, router_logits, top_k, renormalize)
        num_tokens = x.shape[0]
        if self._out_buf is None or self._out_buf.shape[0] < num_tokens:
            self._out_buf = torch.empty((num_tokens, x.shape[-1]), dtype=x.dtype, device=x.device)  # ok: FC107
        # Dequantize and run only the experts this batch routes to.
        active_experts = torch.unique(topk_ids).tolist()  # ok: FC101
        w13 = layer.w13_weight.to(x.dtype) * layer.w13_weight_scale.view(-1, 1, 1).to(x.dtype)
        w2 = layer.w2_weight.to(x.dtype) * layer.w2_weight_scale.view(-1, 1, 1).to(x.dtype)
        return dense_moe_forward(x, w13, w2, topk_weights, topk_ids, active_experts, self._out_buf[:num_tokens])


class Fp8KVCacheMethod(BaseKVCacheMethod):
    """k/v scales stored next to the fp8 weights in the checkpoint."""
