"""FP4 (E2M1 + FP8 block scale) paged KV cache for the decode engine."""

from .cache import FP4PageCache
from .config import FP4Config
from .constants import DEFAULT_BUCKETS, DEQUANT_WORKSPACE_BYTES, E2M1_MAX, FP4_BLOCK, FP8_E4M3_MAX
from .quant import Calibrator, dequant_pages, pack_e2m1

__all__ = [
    "Calibrator",
    "DEFAULT_BUCKETS",
    "DEQUANT_WORKSPACE_BYTES",
    "E2M1_MAX",
    "FP4Config",
    "FP4PageCache",
    "FP4_BLOCK",
    "FP8_E4M3_MAX",
    "dequant_pages",
    "pack_e2m1",
]
