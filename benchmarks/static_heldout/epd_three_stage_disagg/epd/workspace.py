"""Workspaces of the stages, cached by name so that every wrapper of a stage shares them."""

from typing import Dict

import torch

_WS_TIERS = (64 * 1024 * 1024, 256 * 1024 * 1024)
_STAGE_WS: Dict[str, torch.Tensor] = {}


def stage_workspace(name: str, nbytes: int, device) -> torch.Tensor:
    if name not in _STAGE_WS:
        _STAGE_WS[name] = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _STAGE_WS[name]


def prefill_paged_workspace(device) -> torch.Tensor:
    return torch.zeros(_WS_TIERS[1], dtype=torch.uint8, device=device)  # expect: FC106
