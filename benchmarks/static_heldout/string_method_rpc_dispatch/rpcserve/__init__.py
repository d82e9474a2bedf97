"""rpcserve: a small FlashInfer serving engine driven by string-named RPCs."""

from .config import EngineConfig
from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine"]
__version__ = "0.4.0"
