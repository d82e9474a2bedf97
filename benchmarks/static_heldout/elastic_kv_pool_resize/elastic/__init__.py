"""A KV pool that grows and shrinks while the engine serves."""

from elastic.batch import ForwardBatch, Schedule
from elastic.config import ElasticConfig, WorkspaceSize
from elastic.pool import ElasticKVPool
from elastic.remap import remap_page_tables

__all__ = [
    "ElasticConfig",
    "ElasticKVPool",
    "ForwardBatch",
    "Schedule",
    "WorkspaceSize",
    "remap_page_tables",
]
