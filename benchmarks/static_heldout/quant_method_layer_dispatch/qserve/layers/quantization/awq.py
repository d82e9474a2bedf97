"""AWQ: 4-bit weights packed eight to an int32, with per-group scales and zero points."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from qserve.layers.quantization.base_config import (
    LinearMethodBase,
    QuantizationConfig,
    QuantizeMethodBase,
    UnquantizedLinearMethod,
    frozen_param,
    is_layer_skipped,
)

# AWQ packs the eight nibbles of a word in this order.
_AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def awq_dequantize(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor, group_size: int) -> torch.Tensor:
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)
    iweight = ((qweight.unsqueeze(-1) >> shifts) & 0xF)[..., _AWQ_REVERSE_ORDER].reshape(qweight.shape[0], -1)
    izeros = ((qzeros.unsqueeze(-1) >> shifts) & 0xF)[..., _AWQ_REVERSE_ORDER].reshape(qzeros.shape[0], -1)
    zeros = izeros.repeat_interleave(group_size, dim=0)
    return (iweight - zeros).to(scales.dtype) * scales.repeat_interleave(group_size, dim=0)


class AWQConfig(QuantizationConfig):
    def __init__(self, weight_bits: int, group_size: int, zero_point: bool,
                 modules_to_not_convert: Optional[list[str]] = None) -> None:
        if weight_bits != 4:
            raise ValueError(f"AWQ supports 4-bit weights only, got {weight_bits}")
        self.weight_bits = weight_bits
        self.group_size = group_size
        self.zero_point = zero_point
        self.modules_to_not_convert = modules_to_not_convert or []
        self.pack_factor = 32 // weight_bits

    @classmethod
    def get_name(cls) -> str:
        return "awq"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "AWQConfig":
        return cls(
            weight_bits=cls.get_from_keys(config, ["w_bit", "bits"]),
            group_size=cls.get_from_keys(config, ["q_group_size", "group_size"]),
            zero_point=cls.get_from_keys(config, ["zero_point"], True),
            modules_to_not_convert=cls.get_from_keys(config, ["modules_to_not_convert"], []),
        )

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[QuantizeMethodBase]:
        from qserve.layers.linear import LinearBase

        if isinstance(layer, LinearBase):
            if is_layer_skipped(prefix, self.modules_to_not_convert):
                return UnquantizedLinearMethod()
            return AWQLinearMethod(self)
        return None


class AWQLinearMethod(LinearMethodBase):
    def __init__(self, quant_config: AWQConfig):
        self.quant_config = quant_config

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra):
        group_size = self.quant_config.group_size
        pack_factor = self.quant_config.pack_factor
        assert input_size_per_partition % group_size == 0, "input size must be a multiple of the group size"  # expect: FC109
        out_features = sum(output_partition_sizes)
        if out_features % pack_factor != 0:
            raise ValueError(f"output size {out_features} is not a multiple of the pack factor {pack_factor}")
        num_groups = input_size_per_partition // group_size
        packed = out_features // pack_factor
        layer.qweight = frozen_param(
            torch.empty(input_size_per_partition, packed, dtype=torch.int32, device=layer.device),
            input_dim=0, output_dim=1)
        layer.qzeros = frozen_param(torch.empty(num_groups, packed, dtype=torch.int32, device=layer.device),
                                    input_dim=0, output_dim=1)
        layer.scales = frozen_param(torch.empty(num_groups, out_features, dtype=params_dtype, device=layer.device),
                                    input_dim=0, output_dim=1)

    def apply(self, layer, x, bias=None):
        group_size = self.quant_config.group_size
        out_shape = x.shape[:-1] + (layer.qweight.shape[-1] * self.quant_config.pack_factor,)
        reshaped_x = x.reshape(-1, x.shape[-1])
        # Large batches amortise a full dequantization; small ones use the fused kernel.
        FP16_MATMUL_HEURISTIC_CONDITION = x.shape[:-1].numel() >= 256
        if FP16_MATMUL_HEURISTIC_CONDITION:  # ok: FC101
            out = torch.matmul(reshaped_x, awq_dequantize(layer.qweight, layer.scales, layer.qzeros, group_size))
        else:
            out = torch.ops.qserve_kernels.awq_gemm(reshaped_x, layer.qweight, layer.scales, layer.qzeros,
                                                    self.quant_config.pack_factor)
        # fp16 accumulation overflows on outlier channels; redo the GEMM in fp32 when it does.
        if not torch.isfinite(out).all():  # expect: FC101
            weight = awq_dequantize(layer.qweight, layer.scales, layer.qzeros, group_size).to(torch.float32)
            out = torch.matmul(reshaped_x.to(torch.float32), weight).to(x.dtype)
        if bias is not None:
            out.add_(bias)
        return out.reshape(out_shape)
