"""opserve: a small serving engine whose per-step code is a pipeline of stages."""

from opserve.config import EngineConfig
from opserve.model_runner import ModelRunner

__all__ = ["EngineConfig", "ModelRunner"]
