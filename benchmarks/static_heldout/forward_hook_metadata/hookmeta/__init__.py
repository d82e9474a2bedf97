"""hookmeta: a small paged-KV engine whose attention metadata lives in nn.Module hooks."""

from hookmeta.config import EngineConfig
from hookmeta.forward_batch import ForwardBatch, ForwardMode

__all__ = ["EngineConfig", "ForwardBatch", "ForwardMode"]
