from .block_pool import NULL_BLOCK, HybridKVCacheCoordinator

__all__ = ["NULL_BLOCK", "HybridKVCacheCoordinator"]
