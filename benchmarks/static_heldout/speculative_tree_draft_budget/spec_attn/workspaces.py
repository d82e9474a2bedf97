"""Workspace allocation for the draft path (FA2 kernels only: no zeroing needed)."""
from __future__ import annotations

import torch


def make_draft_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    if nbytes <= 0:
        raise ValueError(f"draft workspace must be positive, got {nbytes} bytes")
    return torch.empty(nbytes, dtype=torch.uint8, device=device)
