from .kv_pool import PagedKVPool

__all__ = ["PagedKVPool"]
