"""Base classes of the quantization configs and of the methods they hand to layers.

A layer asks its config for a method once, in its constructor
(``quant_config.get_quant_method(self, prefix)``), keeps it in ``self.quant_method``
and delegates weight creation, post-load processing and the forward computation to it.
"""

from __future__ import annotations

import fnmatch
from abc import ABC, abstractmethod
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import Parameter

FP8_E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max


def frozen_param(data: torch.Tensor, **weight_attrs: Any) -> Parameter:
    """A weight the loader fills; ``input_dim``/``output_dim`` tell it how the tensor is sharded."""
    param = Parameter(data, requires_grad=False)
    for key, value in weight_attrs.items():
        setattr(param, key, value)
    return param


def is_layer_skipped(prefix: str, ignored_layers: list[str]) -> bool:
    return any(prefix == pattern or fnmatch.fnmatch(prefix, pattern) for pattern in ignored_layers)


class QuantizeMethodBase(ABC):
    """What a quantized layer delegates to."""

    @abstractmethod
    def create_weights(self, layer: nn.Module, *weight_args: Any, **extra_weight_attrs: Any) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply(self, layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Runs once, after the checkpoint is loaded (repacking, requantizing)."""
        return None


class QuantizationConfig(ABC):
    @classmethod
    @abstractmethod
    def get_name(cls) -> str:
        raise NotImplementedError

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict[str, Any]) -> "QuantizationConfig":
        raise NotImplementedError

    @abstractmethod
    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[QuantizeMethodBase]:
        raise NotImplementedError

    @staticmethod
    def get_from_keys(config: dict[str, Any], keys: list[str], default: Any = None) -> Any:
        value = next((config[key] for key in keys if key in config), default)
        if value is None:
            raise ValueError(f"none of {keys} found in the quantization config")
        return value


class LinearMethodBase(QuantizeMethodBase):
    @abstractmethod
    def create_weights(self, layer: nn.Module, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra: Any) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise NotImplementedError


class UnquantizedLinearMethod(LinearMethodBase):
    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra):
        layer.weight = frozen_param(
            torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype, device=layer.device),
            input_dim=1, output_dim=0)

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)


class FusedMoEMethodBase(QuantizeMethodBase):
    @abstractmethod
    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype, **extra: Any) -> None:
        raise NotImplementedError

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, router_logits: torch.Tensor, top_k: int,
              renormalize: bool) -> torch.Tensor:
        raise NotImplementedError


class BaseKVCacheMethod(QuantizeMethodBase):
    """fp8 KV cache: per-layer k/v scales, from the checkpoint or computed on the fly."""

    def __init__(self, quant_config: Optional[QuantizationConfig]):
        self.quant_config = quant_config

    def create_weights(self, layer: nn.Module) -> None:
        # -1.0 marks a scale the checkpoint does not provide.
        layer.k_scale = frozen_param(torch.tensor(-1.0, dtype=torch.float32, device=layer.device))
        layer.v_scale = frozen_param(torch.tensor(-1.0, dtype=torch.float32, device=layer.device))

    def apply(self, layer: nn.Module, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer.calculate_kv_scales:
            k_amax = key.abs().amax().to(torch.float32)
            v_amax = value.abs().amax().to(torch.float32)
            layer._k_scale.copy_(torch.maximum(layer._k_scale, k_amax / FP8_E4M3_MAX))
            layer._v_scale.copy_(torch.maximum(layer._v_scale, v_amax / FP8_E4M3_MAX))
            # The attention kernels take the scales as Python floats.
            layer._k_scale_float, layer._v_scale_float = torch.stack([layer._k_scale, layer._v_scale]).tolist()  # expect: FC101
        elif layer._k_scale_float == 1.0 and layer._v_scale_float == 1.0:  # ok: FC101
            return key.to(layer.kv_cache_torch_dtype), value.to(layer.kv_cache_torch_dtype)
        key = (key / layer._k_scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
        value = (value / layer._v_scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
        return key.to(layer.kv_cache_torch_dtype), value.to(layer.kv_cache_torch_dtype)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        k_scale, v_scale = torch.stack([layer.k_scale, layer.v_scale]).tolist()  # ok: FC101
        k_scale = k_scale if k_scale > 0.0 else 1.0
        v_scale = v_scale if v_scale > 0.0 else 1.0
        layer._k_scale.fill_(k_scale)
        layer._v_scale.fill_(v_scale)
        layer._k_scale_float = k_scale
        layer._v_scale_float = v_scale
        del layer.k_scale
        del layer.v_scale
