"""tupserve: a serving engine whose per-step metadata are plain positional tuples."""

from .config import EngineConfig

__all__ = ["EngineConfig"]
__version__ = "0.4.2"
