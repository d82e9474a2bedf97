"""Workspace factories. Each is cached so every closure that asks for one gets the same storage."""

from __future__ import annotations

import functools

import torch

from .config import WINDOW_WORKSPACE_BYTES


def _cuda(device_index: int) -> torch.device:
    return torch.device("cuda", device_index)


@functools.lru_cache(maxsize=None)
def shared_float_workspace(device_index: int, nbytes: int) -> torch.Tensor:
    """Float workspace of the FA2 eager decode wrapper (one buffer per size and device)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=_cuda(device_index))  # ok: FC105


@functools.lru_cache(maxsize=None)
def window_workspace(device_index: int) -> torch.Tensor:
    """Workspace of the sliding-window decode wrapper."""
    return torch.zeros(WINDOW_WORKSPACE_BYTES, dtype=torch.uint8, device=_cuda(device_index))  # expect: FC106


@functools.cache
def trtllm_scratch(device_index: int, nbytes: int) -> torch.Tensor:
    """Scratch of the raw trtllm-gen decode kernel used past the largest graph bucket."""
    return torch.empty(nbytes, dtype=torch.uint8, device=_cuda(device_index))  # expect: FC105
