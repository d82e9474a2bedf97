"""Process-wide FlashInfer workspaces, one per (size, device, zeroing)."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def get_workspace(nbytes: int, device: torch.device, zeroed: bool) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        # trtllm-gen kernels keep their split-k semaphores here
        buf.zero_()
    return buf
