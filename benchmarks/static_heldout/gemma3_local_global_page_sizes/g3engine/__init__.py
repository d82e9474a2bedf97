"""Gemma-3 style engine core: configuration, the two KV pools and window helpers."""
from .config import Gemma3Config, LayerKind, layer_kinds
from .constants import GLOBAL_PAGE_SIZE, GLOBAL_WORKSPACE_BYTES, LOCAL_PAGE_SIZE, PAD_SLOT
from .pools import KVPool, PageTable
from .window import (build_indptr_np, gather_window_pages_np, last_page_len_np, last_slot_np, pages_to_release,
                     window_page_counts)

__all__ = ["GLOBAL_PAGE_SIZE", "GLOBAL_WORKSPACE_BYTES", "LOCAL_PAGE_SIZE", "PAD_SLOT", "Gemma3Config", "KVPool",
           "LayerKind", "PageTable", "build_indptr_np", "gather_window_pages_np", "last_page_len_np", "last_slot_np",
           "layer_kinds", "pages_to_release", "window_page_counts"]
