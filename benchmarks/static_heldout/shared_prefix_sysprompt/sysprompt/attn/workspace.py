"""Process-wide workspaces, shared by the wrappers of one role."""
from __future__ import annotations

from typing import Dict

import torch

_WORKSPACES: Dict[str, torch.Tensor] = {}


def get_workspace(role: str, nbytes: int, device: torch.device) -> torch.Tensor:
    ws = _WORKSPACES.get(role)
    if ws is None or ws.numel() < nbytes:
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
        _WORKSPACES[role] = ws
    return ws
