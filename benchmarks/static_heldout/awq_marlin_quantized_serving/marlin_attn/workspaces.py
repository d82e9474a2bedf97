"""Workspace factories for the AWQ engine's attention wrappers."""
from __future__ import annotations

import functools

import torch

from awq import DECODE_WORKSPACE_BYTES, AWQServeConfig


def decode_graph_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def prefill_workspace(cfg: AWQServeConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def eager_decode_workspace(cfg: AWQServeConfig, device: torch.device) -> torch.Tensor:
    return torch.zeros(cfg.eager_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106


@functools.lru_cache(maxsize=None)
def long_decode_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105
