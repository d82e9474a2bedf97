from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def trtllm_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    """Shared trtllm-gen decode workspace; its counters must start at zero."""
    ws = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # ok: FC105
    ws.zero_()
    return ws
