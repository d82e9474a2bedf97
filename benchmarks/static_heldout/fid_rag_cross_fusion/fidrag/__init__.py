"""Fusion-in-decoder retrieval-augmented generation: encode passages apart, fuse them in the decoder."""

from fidrag.config import FiDConfig

__all__ = ["FiDConfig"]
