"""Device-side rotation of ring page tables (compiled; used in the steady-state decode path)."""

from __future__ import annotations

import torch


@torch.compile(dynamic=True, fullgraph=True)
def wrapped_slot_ids(ring_pages: torch.Tensor, heads: torch.Tensor, valid: torch.Tensor, window_pages: int) -> torch.Tensor:
    """Page ids of each row, oldest first (ring slots head+1-valid .. head mod window_pages); -1 past `valid`."""
    cols = torch.arange(window_pages, device=ring_pages.device)
    start = heads[:, None] + 1 - valid[:, None]
    order = torch.remainder(start + cols[None, :], window_pages)
    ids = torch.gather(ring_pages, 1, order.long())
    return torch.where(cols[None, :] < valid[:, None], ids, torch.full_like(ids, -1))  # ok: FC101
