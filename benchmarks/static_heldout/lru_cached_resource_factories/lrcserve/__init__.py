"""lrcserve: a speculative decode engine whose resources live behind functools caches."""
from .config import EngineConfig, load_config

__all__ = ["EngineConfig", "load_config"]
