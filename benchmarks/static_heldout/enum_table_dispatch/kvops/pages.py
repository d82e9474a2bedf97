"""Page-table helpers shared by the attention backend and the memory manager.

``kvops`` is a namespace folder of vendored ops (no ``__init__.py``); it is importable as ``kvops.pages``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tabserve.attention.backend import FlashInferTableBackend


def gather_kv_indices(
    req_to_page: torch.Tensor, rows_cpu: torch.Tensor, pages_cpu: torch.Tensor, out: torch.Tensor
) -> int:
    """Write the pages of each request, back to back, into ``out``; returns how many were written."""
    pieces = [req_to_page[row, :n] for row, n in zip(rows_cpu.tolist(), pages_cpu.tolist())]  # ok: FC101
    total = sum(p.shape[0] for p in pieces)
    if pieces:
        torch.cat(pieces, out=out[:total])
    return total


def remap_kv_pages(backend: "FlashInferTableBackend", old_to_new: torch.Tensor) -> None:
    """Apply a defragmentation move (old page id -> new page id) to everything that names pages."""
    lut = old_to_new.to(torch.int32)
    backend.req_to_page.copy_(lut[backend.req_to_page.long()])  # ok: FC104
    indices = backend.bufs.kv_indices
    indices.copy_(lut[indices.long()])  # expect: FC104
