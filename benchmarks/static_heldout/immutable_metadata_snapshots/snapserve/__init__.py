"""snapserve: a decode/prefill engine whose attention metadata are immutable snapshots."""

from snapserve.config import GRAPH_BUCKETS, PAGE_SIZE, EngineConfig

__all__ = ["EngineConfig", "GRAPH_BUCKETS", "PAGE_SIZE"]
