"""Expert offloading for MoE serving: experts live in pinned host memory, an LRU keeps some on the GPU."""

from .config import PREFILL_WS_BYTES, OffloadConfig
from .lru import ExpertLRU

__all__ = ["PREFILL_WS_BYTES", "ExpertLRU", "OffloadConfig"]
