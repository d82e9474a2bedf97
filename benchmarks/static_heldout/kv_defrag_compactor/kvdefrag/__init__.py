"""KV-cache defragmentation for a paged decode server."""

from kvdefrag.config import DefragConfig

__all__ = ["DefragConfig"]
