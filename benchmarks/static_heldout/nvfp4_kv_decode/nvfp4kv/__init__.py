"""Decode over an NVFP4 / FP8 KV cache with per-block scales."""

from nvfp4kv.limits import QuantLimits

__all__ = ["QuantLimits"]
