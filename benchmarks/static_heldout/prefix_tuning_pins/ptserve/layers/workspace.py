from __future__ import annotations

import torch


def alloc_workspace(nbytes: int, device: torch.device, zeroed: bool) -> torch.Tensor:
    """One workspace allocation; ``zeroed`` for kernels that keep counters in it."""
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        buf.zero_()
    return buf
