"""FP8 KV cache: per-head scales in their own device buffers, quantised on write."""

from fp8kv.cache import Fp8PagedKVCache
from fp8kv.config import FP8_E4M3_MAX, Fp8ServeConfig, KVDtype
from fp8kv.scales import HeadScales, ScaleTracker

__all__ = ["FP8_E4M3_MAX", "Fp8PagedKVCache", "Fp8ServeConfig", "HeadScales", "KVDtype", "ScaleTracker"]
