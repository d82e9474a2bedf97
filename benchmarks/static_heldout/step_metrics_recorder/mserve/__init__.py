"""A FlashInfer serving engine with Prometheus-style metrics and a step recorder."""

from .config import EngineConfig
from .forward_batch import ForwardBatch, ForwardMode

__all__ = ["EngineConfig", "ForwardBatch", "ForwardMode"]
