"""Workspace getters for the JSON-mode engine."""
from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def eager_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def jump_forward_workspace(device: torch.device) -> torch.Tensor:
    nbytes = int(os.environ.get("JSONMODE_JF_WORKSPACE_MB", "256")) << 20
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # expect: FC106
