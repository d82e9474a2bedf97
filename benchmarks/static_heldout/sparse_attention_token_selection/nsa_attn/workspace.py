"""Workspace factories of the sparse decode backend."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def dense_long_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    # shared by every trtllm-gen call of the eager dense path on this device
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def prefill_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    # the FA2 prefill planner writes every byte it later reads
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


def dense_long_workspace_bytes(max_batch: int, num_qo_heads: int, max_context: int) -> int:
    return max_batch * num_qo_heads * max(max_context // 1024, 1) * 4096
