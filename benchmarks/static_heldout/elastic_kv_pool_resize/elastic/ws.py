"""Workspace factories."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def eager_decode_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def make_workspace(nbytes: int, device: torch.device, zeroed: bool = True) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        ws.zero_()
    return ws
