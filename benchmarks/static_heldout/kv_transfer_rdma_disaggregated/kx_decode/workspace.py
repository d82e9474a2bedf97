"""Workspaces of the decode node, cached per device and size."""

from __future__ import annotations

from typing import Dict, Tuple

import torch

_WS_CACHE: Dict[Tuple[str, int], torch.Tensor] = {}


def overflow_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    key = (str(device), nbytes)
    if key not in _WS_CACHE:
        _WS_CACHE[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _WS_CACHE[key]


def tail_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws


def split_workspace_bytes(max_batch: int, num_qo_heads: int, head_dim: int, max_context: int) -> int:
    splits = max(1, max_context // 8192)
    return max_batch * num_qo_heads * splits * (head_dim + 1) * 4
