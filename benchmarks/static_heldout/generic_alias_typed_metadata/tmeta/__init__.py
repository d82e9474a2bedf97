"""tmeta: typed attention metadata and the containers the serving stack shares."""

from tmeta.batch import ForwardBatch, SamplingInfo
from tmeta.config import GRAPH_BUCKETS, EngineConfig, bucket_for
from tmeta.generic import AttentionBackend, BucketTable, MetadataSlot, PagePool
from tmeta.metadata import (
    AttnMetadata,
    DecodeMetadata,
    ExtendMetadata,
    Meta,
    StepMeta,
    build_metadata,
    last_page_lens,
    total_kv_pages,
)

__all__ = [
    "AttentionBackend",
    "AttnMetadata",
    "BucketTable",
    "DecodeMetadata",
    "EngineConfig",
    "ExtendMetadata",
    "ForwardBatch",
    "GRAPH_BUCKETS",
    "Meta",
    "MetadataSlot",
    "PagePool",
    "SamplingInfo",
    "StepMeta",
    "bucket_for",
    "build_metadata",
    "last_page_lens",
    "total_kv_pages",
]
