"""Workspace factories: one buffer per (size, device), shared by every wrapper that asks."""
import functools

import torch


@functools.lru_cache(maxsize=None)
def scratch_workspace(nbytes: int, device: str) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


@functools.lru_cache(maxsize=None)
def zeroed_workspace(nbytes: int, device: str) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    buf.zero_()
    return buf
