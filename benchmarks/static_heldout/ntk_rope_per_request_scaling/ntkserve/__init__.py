"""Per-request dynamic NTK RoPE serving: limits, the per-request scale table and the rope caches."""

from ntkserve.config import EAGER_DECODE_WORKSPACE_BYTES, NTKConfig
from ntkserve.rope_cache import RopeCache
from ntkserve.scaling import ScaleTable, ntk_alpha

__all__ = ["EAGER_DECODE_WORKSPACE_BYTES", "NTKConfig", "RopeCache", "ScaleTable", "ntk_alpha"]
