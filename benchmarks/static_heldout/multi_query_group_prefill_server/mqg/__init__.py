from .chunking import Chunk, ChunkPlanner
from .config import ServerConfig

__all__ = ["Chunk", "ChunkPlanner", "ServerConfig"]
