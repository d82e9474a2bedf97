"""pimeta: per-step attention metadata as dataclasses (``__post_init__`` uploads, ``from_requests`` constructors)."""
from .config import GRAPH_BATCH_SIZES, PAGE_SIZE, ServeConfig
from .metadata import DecodeMetadata, GraphBuffers, PagedPlanArgs, PrefillMetadata, RaggedPlanArgs, Req

__all__ = ["GRAPH_BATCH_SIZES", "PAGE_SIZE", "DecodeMetadata", "GraphBuffers", "PagedPlanArgs", "PrefillMetadata",
           "RaggedPlanArgs", "Req", "ServeConfig"]
