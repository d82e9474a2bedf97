"""genserve: a serving engine whose step is a pipeline of generator stages."""

from .config import EngineConfig
from .engine import Engine

__all__ = ["Engine", "EngineConfig"]
