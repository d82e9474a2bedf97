"""Star Attention: blockwise local context encoding with an anchor block, global query attention."""

from staratt.blocks import ContextLayout, cu_lens, split_context, split_query_tokens
from staratt.config import ANCHOR_WORKSPACE_BYTES, DEFAULT_PAGE_SIZE, PLAN_STATE_FIELDS, StarConfig
from staratt.merge import merge_all

__all__ = [
    "ANCHOR_WORKSPACE_BYTES", "DEFAULT_PAGE_SIZE", "PLAN_STATE_FIELDS", "ContextLayout", "StarConfig",
    "cu_lens", "merge_all", "split_context", "split_query_tokens",
]
