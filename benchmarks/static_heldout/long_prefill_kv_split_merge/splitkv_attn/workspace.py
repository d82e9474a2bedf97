"""Workspaces: one per chunk wrapper (each is planned before any of them runs) and the
trtllm-gen context kernel's scratch for prompts that fit in a single chunk."""

import functools
from typing import List

import torch

from splitkv import SplitConfig


@functools.lru_cache(maxsize=None)
def trtllm_context_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def chunk_workspaces(cfg: SplitConfig, device) -> List[torch.Tensor]:
    n = cfg.max_chunks + 1
    return [torch.empty(cfg.chunk_workspace_bytes(), dtype=torch.uint8, device=device) for _ in range(n)]  # ok: FC105
