"""Workspace factories shared by the critique decoder's kernels."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def get_critique_trtllm_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    """One trtllm-gen decode workspace per device, reused by every critique step."""
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def zeroed_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws
