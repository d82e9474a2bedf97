"""Prompt embedding / layer-0 KV cache for a serving engine."""
from .config import ServerConfig
from .hashing import prompt_hash
from .lru import EmbeddingLRU

__all__ = ["EmbeddingLRU", "ServerConfig", "prompt_hash"]
