"""Shared length/indptr helpers and the host mirrors a paged-attention engine keeps per step."""

from shmirror.config import EngineConfig

__all__ = ["EngineConfig"]
