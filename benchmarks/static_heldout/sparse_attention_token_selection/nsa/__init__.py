"""Sparse-attention token selection: config, indexer and selection helpers."""

from .config import DEFAULT_BUCKETS, SPARSE_DECODE_WORKSPACE_BYTES, SparseConfig
from .indexer import LightningIndexer
from .selection import (
    count_selected,
    flat_gather_index,
    host_selected_counts,
    pages_from_blocks,
    select_topk_blocks,
    write_sparse_indptr,
)

__all__ = [
    "DEFAULT_BUCKETS", "SPARSE_DECODE_WORKSPACE_BYTES", "SparseConfig", "LightningIndexer",
    "count_selected", "flat_gather_index", "host_selected_counts", "pages_from_blocks",
    "select_topk_blocks", "write_sparse_indptr",
]
