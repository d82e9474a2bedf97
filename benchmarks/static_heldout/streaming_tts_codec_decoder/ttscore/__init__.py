from .config import TTSConfig
from .stream import ChunkScheduler, StreamState

__all__ = ["TTSConfig", "ChunkScheduler", "StreamState"]
