"""Workspace factories of the FP4 attention backend."""

import functools

import torch

from fp4kv import DEQUANT_WORKSPACE_BYTES, FP4Config


def graph_workspace(cfg: FP4Config, device) -> torch.Tensor:
    return torch.zeros(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106


def eager_workspace(device) -> torch.Tensor:
    return torch.zeros(DEQUANT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=None)
def trtllm_workspace(nbytes: int, device: str) -> torch.Tensor:
    # shared by every native-FP4 decode call on this device
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def prefill_workspace(cfg: FP4Config, device) -> torch.Tensor:
    return torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
