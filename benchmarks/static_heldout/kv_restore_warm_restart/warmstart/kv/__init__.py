from warmstart.kv.pool import PagedKVPool, ReqToPageTable

__all__ = ["PagedKVPool", "ReqToPageTable"]
