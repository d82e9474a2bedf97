"""Small tensor helpers shared by the cache, the scheduler and the attention backends."""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch


def exclusive_cumsum(lens: torch.Tensor) -> torch.Tensor:
    """[l0, l1, ...] -> [0, l0, l0 + l1, ...] as int32, on the device of `lens`."""
    out = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=lens.device)
    torch.cumsum(lens, dim=0, out=out[1:])
    return out


def ring_window_positions(seq_lens: torch.Tensor, window: int) -> torch.Tensor:
    """Rope positions of the tokens still inside the window, per request, oldest first."""
    max_len = int(seq_lens.max())  # expect: FC101
    span = min(max_len, window)
    base = torch.clamp(seq_lens.to(torch.int64) - span, min=0)
    offs = torch.arange(span, device=seq_lens.device, dtype=torch.int64)
    return base[:, None] + offs[None, :]


def host_page_table(pages_per_req: np.ndarray, seq_lens_np: np.ndarray, page_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pinned (indptr, last_page_len) built on the host for a page run per request."""
    indptr = np.zeros(len(pages_per_req) + 1, dtype=np.int32)
    np.cumsum(pages_per_req, out=indptr[1:])
    last = ((seq_lens_np - 1) % page_size + 1).astype(np.int32)
    indptr_t = torch.tensor(indptr, dtype=torch.int32, pin_memory=True)
    last_t = torch.tensor(last, dtype=torch.int32, pin_memory=True)
    return indptr_t, last_t


def stage_like(host: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return host.to(like, non_blocking=True)
