"""Automatic prefix caching: chained block hashes and a ref-counted block pool."""
from .block_pool import BlockPool, KVBlock
from .config import DECODE_WORKSPACE_BYTES, NULL_BLOCK_ID, PrefixCacheConfig
from .hashing import BlockHash, hash_block_tokens, hash_request_blocks

__all__ = ["BlockHash", "BlockPool", "DECODE_WORKSPACE_BYTES", "KVBlock", "NULL_BLOCK_ID", "PrefixCacheConfig",
           "hash_block_tokens", "hash_request_blocks"]
