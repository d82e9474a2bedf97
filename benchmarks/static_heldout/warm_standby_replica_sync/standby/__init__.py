"""A warm standby replica: KV pages and page tables mirrored from the primary every few steps."""

from standby.config import ReplicaConfig
from standby.pages import PagePool, max_pages, page_offsets

__all__ = ["ReplicaConfig", "PagePool", "max_pages", "page_offsets"]
