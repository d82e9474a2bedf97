"""Inline-capture decode engine: configuration, constants and batch types."""
from .batch import (
    DecodeBatch,
    flat_page_indices,
    host_indptr,
    host_last_page_len,
    num_pages_total,
)
from .config import EngineConfig
from .constants import GRAPH_BATCH_SIZES, PAGE_SIZE, PREFILL_WORKSPACE_BYTES

__all__ = [
    "DecodeBatch",
    "EngineConfig",
    "GRAPH_BATCH_SIZES",
    "PAGE_SIZE",
    "PREFILL_WORKSPACE_BYTES",
    "flat_page_indices",
    "host_indptr",
    "host_last_page_len",
    "num_pages_total",
]
