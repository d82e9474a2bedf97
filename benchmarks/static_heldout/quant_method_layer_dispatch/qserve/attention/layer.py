"""Attention layer: a KV-cache quant method and a backend impl, both chosen at construction."""

from __future__ import annotations

import functools
import os
from typing import Any, Optional

import torch
from torch import nn

from qserve.attention.backends.common import AttentionBackend
from qserve.attention.backends.flashinfer import FlashInferBackend, get_kv_cache_layout
from qserve.config import EngineConfig
from qserve.layers.quantization.base_config import BaseKVCacheMethod, QuantizationConfig, QuantizeMethodBase

_ATTN_BACKENDS: dict[str, type[AttentionBackend]] = {
    "FLASHINFER": FlashInferBackend,
}

_KV_CACHE_TORCH_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}


@functools.lru_cache(maxsize=None)
def get_attn_backend(head_size: int, kv_cache_dtype: str, block_size: int) -> type[AttentionBackend]:
    name = os.environ.get("QSERVE_ATTENTION_BACKEND", "FLASHINFER")
    backend_cls = _ATTN_BACKENDS.get(name)
    if backend_cls is None:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(_ATTN_BACKENDS)}")
    if head_size not in backend_cls.get_supported_head_sizes():
        raise ValueError(f"{name} does not support head size {head_size}")
    return backend_cls


class Attention(nn.Module):
    """Paged attention over this layer's KV cache.

    ``quant_method`` (fp8 KV cache) quantizes the new keys and values and owns the k/v scales;
    ``impl`` runs the backend's kernels with the metadata the builder planned for this step.
    """

    quant_method: Optional[QuantizeMethodBase]

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, engine_config: EngineConfig,
                 quant_config: Optional[QuantizationConfig] = None, prefix: str = "",
                 sliding_window: Optional[int] = None, device: torch.device | str = "cuda") -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads
        self.layer_name = prefix
        self.device = torch.device(device)
        self.kv_cache_dtype = engine_config.kv_cache_dtype
        self.kv_cache_torch_dtype = _KV_CACHE_TORCH_DTYPES.get(self.kv_cache_dtype)
        self.calculate_kv_scales = engine_config.calculate_kv_scales
        # Scales the kernels use; the quant method fills them from the checkpoint after loading.
        self._k_scale = torch.ones((), dtype=torch.float32, device=self.device)
        self._v_scale = torch.ones((), dtype=torch.float32, device=self.device)
        self._k_scale_float = 1.0
        self._v_scale_float = 1.0

        quant_method = quant_config.get_quant_method(self, prefix=prefix) if quant_config is not None else None
        if quant_method is None and self.kv_cache_dtype.startswith("fp8"):
            quant_method = BaseKVCacheMethod(quant_config)
        self.quant_method = quant_method
        if self.quant_method is not None:
            self.quant_method.create_weights(self)

        backend_cls = get_attn_backend(head_size, self.kv_cache_dtype, engine_config.block_size)
        self.attn_backend = backend_cls
        impl_cls = backend_cls.get_impl_cls()
        self.impl = impl_cls(num_heads, head_size, scale, num_kv_heads, sliding_window, self.kv_cache_dtype,
                             get_kv_cache_layout(engine_config, sliding_window))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: Any) -> torch.Tensor:
        if self.quant_method is not None and self.kv_cache_dtype.startswith("fp8"):
            key, value = self.quant_method.apply(self, key, value)
        output = torch.empty_like(query)
        return self.impl.forward(self, query, key, value, kv_cache, attn_metadata, output)
