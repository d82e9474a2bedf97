"""descserve: a paged-KV serving engine whose persistent tensors are owned by descriptors
(``descserve.descriptors``), declared by the backends, the graph runner and the drafter."""

from .config import EngineConfig
from .forward_batch import ForwardMode, ScheduledBatch
from .model_runner import ModelRunner

__all__ = ["EngineConfig", "ForwardMode", "ModelRunner", "ScheduledBatch"]
__version__ = "0.4.0"
