"""Prefill on one CUDA stream while decode graphs replay on another."""

from overlap.batches import Admission, DecodeBatch, PrefillBatch, StepPlan, make_decode_batch, make_prefill_batch
from overlap.config import OverlapConfig
from overlap.mempool import StreamAwarePool
from overlap.streams import StreamSet, make_streams

__all__ = [
    "Admission",
    "DecodeBatch",
    "OverlapConfig",
    "PrefillBatch",
    "StepPlan",
    "StreamAwarePool",
    "StreamSet",
    "make_decode_batch",
    "make_prefill_batch",
    "make_streams",
]
