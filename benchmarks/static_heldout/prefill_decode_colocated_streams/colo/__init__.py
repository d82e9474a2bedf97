"""Prefill and decode of one engine, co-located on two CUDA streams."""
from .batches import DecodeBatch, PrefillBatch, build_decode_batch, build_prefill_batch
from .config import EngineConfig
from .constants import DECODE_BUCKETS, DECODE_WS_BYTES, PAGE_SIZE
from .merge import OutputMerger
from .streams import StreamPair

__all__ = [
    "DECODE_BUCKETS",
    "DECODE_WS_BYTES",
    "PAGE_SIZE",
    "DecodeBatch",
    "EngineConfig",
    "OutputMerger",
    "PrefillBatch",
    "StreamPair",
    "build_decode_batch",
    "build_prefill_batch",
]
