"""Workspaces of a replica's wrappers and of the trtllm-gen catch-up kernel."""

from typing import Optional

import torch

from standby.config import ReplicaConfig

# (small, large) graph workspace tiers
_WS_TIERS = (64 << 20, 192 << 20)

_TRT_WS: Optional[torch.Tensor] = None


def graph_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(_WS_TIERS[1], dtype=torch.uint8, device=device)  # expect: FC106


def eager_workspace(cfg: ReplicaConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)


def prefill_workspace(cfg: ReplicaConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def verify_workspace(cfg: ReplicaConfig, device: torch.device) -> torch.Tensor:
    rows = cfg.decode_buckets[-1] * cfg.num_qo_heads
    return torch.zeros(rows * (cfg.head_dim + 1) * 4 * 16, dtype=torch.uint8, device=device)  # ok: FC106


def trtllm_workspace(cfg: ReplicaConfig, device: torch.device) -> torch.Tensor:
    global _TRT_WS
    if _TRT_WS is None:
        _TRT_WS = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _TRT_WS
