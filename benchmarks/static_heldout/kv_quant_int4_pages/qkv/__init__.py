"""INT4 / FP8 paged KV-cache quantization: configuration, per-page scales, kernels."""
from qkv.config import KVDtype, QuantKVConfig
from qkv.scales import PageScaleTable

__all__ = ["KVDtype", "PageScaleTable", "QuantKVConfig"]
