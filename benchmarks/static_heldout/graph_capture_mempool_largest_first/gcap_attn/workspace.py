"""Workspace factories for the attention backend."""

from __future__ import annotations

import functools
import os

import torch

from gcap.config import GraphConfig


def graph_workspace(device: torch.device) -> torch.Tensor:
    """Float workspace shared by every bucket's graph wrapper (overridable for large-vocab deployments)."""
    mib = int(os.environ.get("GCAP_GRAPH_WORKSPACE_MB", "256"))
    return torch.zeros(mib << 20, dtype=torch.uint8, device=device)  # expect: FC106


def eager_workspace(cfg: GraphConfig, device: torch.device) -> torch.Tensor:
    return torch.zeros(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106


@functools.lru_cache(maxsize=4)
def trtllm_decode_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    """trtllm-gen decode scratch, one per device and size (shared by every caller)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def trtllm_gen_prefill_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws
