"""cfserve: a small paged-KV decode engine whose per-step code is assembled from closures.

Every hot function (decode step, replay preparation, sampler, release, compaction) is produced by a
``make_*`` factory at start-up and captures the buffers and FlashInfer wrappers it needs, so the engine
object itself only routes batches to the right closure.
"""

from .batch import ForwardBatch, Request
from .config import EngineConfig

__all__ = ["EngineConfig", "ForwardBatch", "Request"]
