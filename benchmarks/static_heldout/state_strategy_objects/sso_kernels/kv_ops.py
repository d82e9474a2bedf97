"""In-place page-table helpers (namespace package: no __init__.py)."""

from __future__ import annotations

import torch


def remap_pages_(page_table: torch.Tensor, old_to_new: torch.Tensor) -> None:
    """Rewrite page ids in place after the block manager moved pages."""
    n = page_table.shape[0]
    page_table.copy_(old_to_new[page_table[:n].long()].to(page_table.dtype))


def build_unique_indptr(seq_lens: torch.Tensor, prefix_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    pages = (seq_lens - prefix_lens + page_size - 1) // page_size
    out = torch.zeros(pages.shape[0] + 1, dtype=torch.int32, device=pages.device)
    torch.cumsum(pages, 0, out=out[1:])
    return out
