"""Fluent attention-metadata builders for a FlashInfer serving engine."""
from .builders import DecodeMetadataBuilder, MetadataBuilder, PrefillMetadataBuilder
from .builders import WindowDecodeBuilder
from .config import DRAFT_WORKSPACE_BYTES, GRAPH_BUCKETS, PAGE_SIZE, EngineConfig, window_workspace_bytes
from .metadata import DecodeMetadata, ForwardBatch, PrefillMetadata

__all__ = [
    "DRAFT_WORKSPACE_BYTES", "GRAPH_BUCKETS", "PAGE_SIZE", "DecodeMetadata", "DecodeMetadataBuilder",
    "EngineConfig", "ForwardBatch", "MetadataBuilder", "PrefillMetadata",
    "PrefillMetadataBuilder", "WindowDecodeBuilder", "window_workspace_bytes",
]
