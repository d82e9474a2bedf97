from text_generation_server.layers.attention.common import (
    ATTENTION,
    BLOCK_SIZE,
    Seqlen,
    attention_backend,
)
from text_generation_server.layers.attention.kv_cache import KVCache, attention, paged_attention

__all__ = [
    "ATTENTION",
    "BLOCK_SIZE",
    "KVCache",
    "Seqlen",
    "attention",
    "attention_backend",
    "paged_attention",
]
