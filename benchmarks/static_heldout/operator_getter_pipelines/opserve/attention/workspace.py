"""Workspace buffers for the FlashInfer planners and kernels."""

from __future__ import annotations

import operator

import torch

# Buffers no engine limit bounds, in MiB.
_WORKSPACE_MIB = {"shared_prefix": 64, "encoder": 32}


def empty_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """Uninitialised workspace: the FA2 planners write every byte they later read."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def zeroed_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """Workspace for kernels that keep split-k semaphores in it and expect them zero on first use."""
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws


def shared_prefix_workspace(device: torch.device) -> torch.Tensor:
    """Workspace of the shared system-prompt prefill: every request attends to the same pages."""
    nbytes = operator.itemgetter("shared_prefix")(_WORKSPACE_MIB) << 20
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # expect: FC106
