"""Workspace factories shared by every backend instance on a device."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def get_trtllm_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    # one buffer per device; the trtllm-gen decode kernel keeps its multi-CTA counters here
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105
