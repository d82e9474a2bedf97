"""Radix prefix cache, token-slot allocator and the batch types of the engine."""
from .allocator import PagedTokenAllocator, ReqToTokenPool
from .batch import ForwardBatch, Req
from .global_config import global_config
from .radix_cache import RadixCache, TreeNode

__all__ = ["ForwardBatch", "PagedTokenAllocator", "RadixCache", "Req", "ReqToTokenPool", "TreeNode", "global_config"]
