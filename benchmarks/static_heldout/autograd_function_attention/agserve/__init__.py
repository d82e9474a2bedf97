"""agserve: attention as torch.autograd.Functions over FlashInfer wrappers."""

from .config import EngineConfig

__all__ = ["EngineConfig"]
