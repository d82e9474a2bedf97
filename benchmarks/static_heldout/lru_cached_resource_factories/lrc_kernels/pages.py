"""Page-table helpers shared by the target and draft paths, and the page compactor."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from lrcserve.attention import FlashInferDecodeBackend


def page_math(lens_np: np.ndarray, page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pages per row and tokens in each row's last page (host)."""
    pages = (lens_np + page_size - 1) // page_size
    last = lens_np - (pages - 1) * page_size
    return pages.astype(np.int32), last.astype(np.int32)


def fill_kv_indices(
    req_to_page: torch.Tensor,
    req_pool_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    out: torch.Tensor,
    total: int,
) -> None:
    """Gather each row's page ids into out[:total], laid out by kv_indptr (all on the device)."""
    counts = kv_indptr[1:] - kv_indptr[:-1]
    rows = torch.repeat_interleave(req_pool_indices, counts, output_size=total)  # ok: FC101
    starts = torch.repeat_interleave(kv_indptr[:-1].long(), counts, output_size=total)
    cols = torch.arange(total, dtype=torch.int64, device=out.device) - starts
    out[:total] = req_to_page[rows, cols]


class PageCompactor:
    """Moves live pages together when the pool fragments; rewrites the page tables it knows."""

    def __init__(self, backend: "FlashInferDecodeBackend", req_to_page: torch.Tensor) -> None:
        self.backend = backend
        self.req_to_page = req_to_page
        self.moves = 0

    def plan_moves(self, free_mask_np: np.ndarray) -> np.ndarray:
        """Old page id -> new page id, packing live pages to the front (host)."""
        live = np.flatnonzero(~free_mask_np)
        remap = np.arange(free_mask_np.shape[0], dtype=np.int32)
        remap[live] = np.arange(live.shape[0], dtype=np.int32)
        return remap

    def compact(self, remap: torch.Tensor) -> None:
        """Apply an old -> new page remap (device) after the allocator moved the KV pages.

        The graph page tables are gathered from req_to_page before every replay, so only
        req_to_page and the eager table (reused by a verify plan in flight) are remapped.
        """
        self.req_to_page.copy_(remap[self.req_to_page.long()])
        be = self.backend
        be.kv_indices.copy_(remap[be.kv_indices.long()])  # ok: FC104
        self.moves += 1
