"""Workspace factories shared by the attention wrappers."""

import functools

import torch


def zeroed_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """trtllm-gen kernels keep their semaphores in the workspace: it must start zeroed."""
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


@functools.lru_cache(maxsize=None)
def scratch_workspace(nbytes: int, device: str) -> torch.Tensor:
    """One scratch buffer per size, shared by the draft wrappers of every engine in the process."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
