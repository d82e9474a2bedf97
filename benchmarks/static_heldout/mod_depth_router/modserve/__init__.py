"""A serving engine for mixture-of-depths decoders (shared depth routing)."""

from modserve.config import MoDConfig

__all__ = ["MoDConfig"]
