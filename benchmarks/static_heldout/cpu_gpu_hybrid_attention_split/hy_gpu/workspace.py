"""Workspaces of the GPU window backend."""

import os

import torch

from hybridattn import HybridConfig


def graph_workspace(cfg: HybridConfig, device) -> torch.Tensor:
    # FA2 decode kernels of the bucket wrappers: no counters kept in the workspace
    return torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def overflow_workspace(cfg: HybridConfig, device) -> torch.Tensor:
    return torch.zeros(cfg.overflow_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106


def inflight_workspace(device) -> torch.Tensor:
    nbytes = int(os.environ.get("HYBRID_INFLIGHT_WS_BYTES", 64 << 20))
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # expect: FC106


def context_workspace(cfg: HybridConfig, device) -> torch.Tensor:
    return torch.empty(cfg.context_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
