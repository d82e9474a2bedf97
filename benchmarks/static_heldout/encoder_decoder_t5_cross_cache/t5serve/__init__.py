"""T5-style encoder-decoder serving: configuration, relative position bias, cross-attention KV cache."""

from .batch import DecoderBatch
from .config import T5Config
from .constants import ENCODER_WS_BYTES, FP16_CLAMP_MARGIN, MAX_DISTANCE, NUM_BUCKETS
from .cross_cache import CrossKVStore
from .relbias import RelativeBiasTable, relative_position_bucket

__all__ = [
    "CrossKVStore",
    "DecoderBatch",
    "ENCODER_WS_BYTES",
    "FP16_CLAMP_MARGIN",
    "MAX_DISTANCE",
    "NUM_BUCKETS",
    "RelativeBiasTable",
    "T5Config",
    "relative_position_bucket",
]
