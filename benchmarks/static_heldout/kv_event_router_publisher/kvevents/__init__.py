"""KV-cache events (blocks stored / removed) published to a prefix-aware router."""

from .events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch
from .hasher import NONE_HASH, BlockHasher
from .publisher import EventPublisher

__all__ = [
    "AllBlocksCleared",
    "BlockHasher",
    "BlockRemoved",
    "BlockStored",
    "EventPublisher",
    "KVEvent",
    "KVEventBatch",
    "NONE_HASH",
]
