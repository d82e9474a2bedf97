"""Mixture of attention spans: kv heads are split into groups with their own window size
(a few global heads, many local ones).  Each group has its own page pool, page lists,
FlashInfer wrappers and metadata; the per-group outputs are merged back per layer."""

from spanattn.layout import HeadGroupLayout
from spanattn.paging import window_page_lists
from spanattn.pool import SpanKVPool
from spanattn.spans import HeadGroup, SpanConfig, default_groups, window_first_pos

__all__ = [
    "HeadGroupLayout",
    "window_page_lists",
    "SpanKVPool",
    "HeadGroup",
    "SpanConfig",
    "default_groups",
    "window_first_pos",
]
