"""Shared pieces of the graph capture engine: configuration, bucket arithmetic, static I/O and the graph pool."""

from gcap.buckets import largest_first, pad_to_bucket, padded_indptr
from gcap.config import GraphConfig
from gcap.mempool import GraphPoolManager
from gcap.static_io import BucketView, StaticIO

__all__ = [
    "BucketView",
    "GraphConfig",
    "GraphPoolManager",
    "StaticIO",
    "largest_first",
    "pad_to_bucket",
    "padded_indptr",
]
