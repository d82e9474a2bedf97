"""Workspace allocation for the decode, long-context and prefill wrappers."""
from __future__ import annotations

import torch

from lpserve.config import ServeConfig, prefill_workspace_bytes


def prefill_workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106


def decode_workspace(cfg: ServeConfig, device: torch.device) -> torch.Tensor:
    # shared by every graph-mode decode wrapper (FA2): sized for the largest bucket
    return torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106


def eager_workspace(cfg: ServeConfig, device: torch.device) -> torch.Tensor:
    # FA2 eager decode past the buckets; plugins borrow its tail as scratch
    return torch.empty(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def long_context_workspace(cfg: ServeConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.long_context_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
