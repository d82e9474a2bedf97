"""Workspace buffers for the FlashInfer and trtllm-gen kernels."""

from __future__ import annotations

import functools

import torch


def scratch_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """Float workspace for the FA2 planners, which initialise whatever they use."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


def zeroed_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """Workspace for kernels that keep semaphores in it and expect them to start at zero."""
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    buf.zero_()
    return buf


@functools.lru_cache(maxsize=4)
def raw_decode_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    """One workspace per device for the direct trtllm-gen decode kernel."""
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105
