"""protoserve: a paged-attention serving engine built on FlashInfer."""

from protoserve.config import EngineConfig

__all__ = ["EngineConfig"]
__version__ = "0.4.2"
