"""A small serving engine whose components are wired by a dependency-injection container."""
from .config import EngineConfig
from .container import Container
from .interfaces import AttentionBackend, KVPool, WorkspaceProvider

__all__ = ["AttentionBackend", "Container", "EngineConfig", "KVPool", "WorkspaceProvider"]
