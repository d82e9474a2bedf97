"""Device helpers for rows that died during a step."""
from __future__ import annotations

import torch


def mask_rows_(buf: torch.Tensor, rows: torch.Tensor, value: int) -> torch.Tensor:
    """Overwrite the entries of ``rows`` in place."""
    return buf.index_fill_(0, rows, value)


@torch.jit.script
def clamp_dead_lengths(lens: torch.Tensor, live: torch.Tensor, n: int) -> torch.Tensor:
    assert n <= lens.numel()  # ok: FC109
    return torch.where(live[:n], lens[:n], torch.ones_like(lens[:n]))
