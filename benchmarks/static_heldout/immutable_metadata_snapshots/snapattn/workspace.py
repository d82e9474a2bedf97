"""Workspace buffers for the FlashInfer wrappers and kernels."""

from __future__ import annotations

import functools

import torch

from snapserve.config import EngineConfig


def float_workspace(cfg: EngineConfig, device: torch.device) -> torch.Tensor:
    """Shared split-k scratch of the FA2 decode wrappers (eager and graph mode)."""
    return torch.empty(cfg.planner_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106


@functools.lru_cache(maxsize=4)
def zeroed_workspace(nbytes: int, device: str) -> torch.Tensor:
    """Semaphore/counter scratch for the trtllm-gen kernels: must start at zero."""
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


def trtllm_workspace_bytes(cfg: EngineConfig) -> int:
    # One counter block per (request, kv head) at the largest batch, plus the split-k partials.
    return cfg.max_num_reqs * cfg.num_kv_heads * 4096 + cfg.planner_workspace_bytes()
