"""compressed-tensors checkpoints: a scheme per target module, taken from the config groups."""

from __future__ import annotations

import fnmatch
from abc import ABC, abstractmethod
from typing import Any, Optional

import torch
from torch import nn

from qserve.layers.quantization.base_config import (
    BaseKVCacheMethod,
    LinearMethodBase,
    QuantizationConfig,
    QuantizeMethodBase,
    UnquantizedLinearMethod,
    frozen_param,
    is_layer_skipped,
)


def scaled_int8_quant(x: torch.Tensor, scale: Optional[torch.Tensor] = None,
                      azp: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Static (given scale, optional zero point) or dynamic per-token int8 quantization."""
    if scale is None:
        scale = x.abs().amax(dim=-1, keepdim=True).to(torch.float32).clamp(min=1e-8) / 127.0
    q = torch.round(x.to(torch.float32) / scale)
    if azp is not None:
        q = q + azp
    return q.clamp(-128, 127).to(torch.int8), scale


class CompressedTensorsScheme(ABC):
    @abstractmethod
    def create_weights(self, layer: nn.Module, input_size_per_partition: int, output_partition_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply_weights(self, layer: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        return None


class CompressedTensorsW8A8Int8(CompressedTensorsScheme):
    def __init__(self, is_static_input_scheme: bool, input_symmetric: bool) -> None:
        self.is_static_input_scheme = is_static_input_scheme
        self.input_symmetric = input_symmetric

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, params_dtype):
        out_features = sum(output_partition_sizes)
        layer.weight = frozen_param(
            torch.empty(out_features, input_size_per_partition, dtype=torch.int8, device=layer.device),
            input_dim=1, output_dim=0)
        layer.weight_scale = frozen_param(torch.empty(out_features, 1, dtype=torch.float32, device=layer.device),
                                          output_dim=0)
        layer.input_scale = None
        layer.input_zero_point = None
        if self.is_static_input_scheme:
            layer.input_scale = frozen_param(torch.empty(1, dtype=torch.float32, device=layer.device))
            if not self.input_symmetric:
                layer.input_zero_point = frozen_param(torch.empty(1, dtype=torch.int32, device=layer.device))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if layer.input_zero_point is not None:
            # (x_q - azp) @ W = x_q @ W - azp * colsum(W)
            layer.azp_adj = frozen_param(layer.weight.to(torch.int32).sum(dim=1))

    def apply_weights(self, layer, x, bias):
        azp = None
        if layer.input_zero_point is not None:
            azp = int(layer.input_zero_point)  # expect: FC101
        x_q, x_scale = scaled_int8_quant(x, layer.input_scale, azp)
        out = torch._int_mm(x_q, layer.weight.t())
        if azp is not None:
            out = out - azp * layer.azp_adj
        out = (out.to(torch.float32) * x_scale * layer.weight_scale.view(1, -1)).to(x.dtype)
        return out + bias if bias is not None else out


class CompressedTensorsLinearMethod(LinearMethodBase):
    """Delegates to the scheme the config attached to the layer (``layer.scheme``)."""

    def __init__(self, quant_config: "CompressedTensorsConfig"):
        self.quant_config = quant_config

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra):
        layer.scheme.create_weights(layer, input_size_per_partition, output_partition_sizes, params_dtype)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.scheme.process_weights_after_loading(layer)

    def apply(self, layer, x, bias=None):
        scheme = layer.scheme
        if scheme is None:
            raise ValueError(f"no compressed-tensors scheme for {layer.prefix}")
        return scheme.apply_weights(layer, x, bias)


class CompressedTensorsKVCacheMethod(BaseKVCacheMethod):
    """fp8 KV cache with the scales a ``kv_cache_scheme`` stored."""


class CompressedTensorsConfig(QuantizationConfig):
    def __init__(self, target_scheme_map: dict[str, dict[str, Any]], ignore: list[str],
                 kv_cache_scheme: Optional[dict[str, Any]] = None) -> None:
        self.target_scheme_map = target_scheme_map
        self.ignore = ignore
        self.kv_cache_scheme = kv_cache_scheme

    @classmethod
    def get_name(cls) -> str:
        return "compressed-tensors"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CompressedTensorsConfig":
        target_scheme_map: dict[str, dict[str, Any]] = {}
        for group in config.get("config_groups", {}).values():
            for target in group.get("targets", []):
                target_scheme_map[target] = {"weights": group.get("weights") or {},
                                             "input_activations": group.get("input_activations") or {}}
        kv_cache_scheme = config.get("kv_cache_scheme")
        if kv_cache_scheme is not None and (kv_cache_scheme.get("type"), kv_cache_scheme.get("num_bits")) != ("float", 8):
            raise NotImplementedError(f"unsupported kv cache scheme {kv_cache_scheme}")
        return cls(target_scheme_map, config.get("ignore", []), kv_cache_scheme)

    def get_scheme(self, prefix: str) -> CompressedTensorsScheme:
        module_name = prefix.rsplit(".", 1)[-1]
        for target, scheme in self.target_scheme_map.items():
            if target in ("Linear", module_name) or fnmatch.fnmatch(prefix, target.removeprefix("re:")):
                weights, acts = scheme["weights"], scheme["input_activations"]
                is_static = not acts.get("dynamic", True)
                if (weights.get("type"), weights.get("num_bits")) == ("int", 8):
                    return CompressedTensorsW8A8Int8(is_static, acts.get("symmetric", True))
                raise NotImplementedError(f"unsupported compressed-tensors scheme for {prefix}: {weights}")
        raise ValueError(f"no compressed-tensors target matches {prefix}")

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[QuantizeMethodBase]:
        from qserve.attention.layer import Attention
        from qserve.layers.linear import LinearBase

        if isinstance(layer, LinearBase):
            if is_layer_skipped(prefix, self.ignore):
                return UnquantizedLinearMethod()
            layer.scheme = self.get_scheme(prefix)
            return CompressedTensorsLinearMethod(self)
        if isinstance(layer, Attention) and self.kv_cache_scheme is not None:
            return CompressedTensorsKVCacheMethod(self)
        return None
