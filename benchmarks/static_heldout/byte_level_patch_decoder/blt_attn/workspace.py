"""Workspace factories for the global transformer's attention."""
from __future__ import annotations

import torch


def make_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def zeroed_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    buf.zero_()
    return buf
