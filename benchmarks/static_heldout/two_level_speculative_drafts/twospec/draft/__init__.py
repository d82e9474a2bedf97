"""Level two: the draft model, its own KV pool, attention and decode graphs."""

from .attn import DraftAttention
from .kv_pool import DraftKVPool

__all__ = ["DraftAttention", "DraftKVPool"]
