"""compatserve: a decode-oriented serving engine that supports two FlashInfer release lines.

Every FlashInfer name the engine uses is imported from :mod:`compatserve.compat`, which
detects the installed release once at import time and papers over the differences.
"""

from compatserve.config import EngineConfig

__all__ = ["EngineConfig"]
__version__ = "0.4.0"
