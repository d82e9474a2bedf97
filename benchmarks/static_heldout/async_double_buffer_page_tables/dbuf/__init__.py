"""Double-buffered page tables: two buffer sets, one replaying, one being filled."""

from dbuf.buffers import BufferSet, make_buffer_set
from dbuf.config import GRAPH_WS_TIERS, DoubleBufferConfig
from dbuf.stager import PageTableStager, StagedTables

__all__ = [
    "BufferSet",
    "DoubleBufferConfig",
    "GRAPH_WS_TIERS",
    "PageTableStager",
    "StagedTables",
    "make_buffer_set",
]
