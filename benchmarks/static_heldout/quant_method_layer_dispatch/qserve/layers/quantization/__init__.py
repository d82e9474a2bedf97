"""Quantization configs, by the ``quant_method`` name checkpoints use."""

from qserve.layers.quantization.awq import AWQConfig
from qserve.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from qserve.layers.quantization.compressed_tensors import CompressedTensorsConfig
from qserve.layers.quantization.fp8 import Fp8Config

QUANT_CONFIGS: dict[str, type[QuantizationConfig]] = {
    "awq": AWQConfig,
    "compressed-tensors": CompressedTensorsConfig,
    "fp8": Fp8Config,
}


def get_quantization_config(quantization: str) -> type[QuantizationConfig]:
    assert quantization in QUANT_CONFIGS, f"unknown quantization method {quantization!r}"  # expect: FC109
    return QUANT_CONFIGS[quantization]


__all__ = [
    "QUANT_CONFIGS",
    "AWQConfig",
    "CompressedTensorsConfig",
    "Fp8Config",
    "QuantizationConfig",
    "QuantizeMethodBase",
    "get_quantization_config",
]
