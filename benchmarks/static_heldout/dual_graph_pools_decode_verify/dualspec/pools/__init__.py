from dualspec.pools.base import GraphPool
from dualspec.pools.draft_pool import DraftDecodePool
from dualspec.pools.verify_pool import VerifyPool

__all__ = ["DraftDecodePool", "GraphPool", "VerifyPool"]
