"""SnapKV-style KV compression for a paged decode engine."""

from snapkv.config import SnapConfig

__all__ = ["SnapConfig"]
