"""Page-move kernels of the compactor (torch ops; a fused CUDA version lives in the extension)."""

import torch


def move_pages(kv_cache: torch.Tensor, src_pages: torch.Tensor, dst_pages: torch.Tensor) -> None:
    """Copy whole pages (every layer, K and V) from src to dst on the current stream."""
    moved = kv_cache.index_select(1, src_pages)
    kv_cache.index_copy_(1, dst_pages, moved)


def remap_page_ids(page_ids: torch.Tensor, remap: torch.Tensor) -> None:
    """Rewrite a list of page ids in place through an old -> new page map."""
    page_ids.copy_(remap.index_select(0, page_ids.long()))
