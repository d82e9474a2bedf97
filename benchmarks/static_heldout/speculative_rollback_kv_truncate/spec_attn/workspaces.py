"""Workspaces for the draft graphs, the target graphs, verify and draft extend."""

from __future__ import annotations

from typing import Dict

import torch

from specroll.config import _WS_BYTES, SpecConfig

_CACHE: Dict[str, torch.Tensor] = {}


def draft_graph_workspace(device: torch.device, long_ctx: bool = False) -> torch.Tensor:
    key = "draft_long" if long_ctx else "draft"
    return torch.zeros(_WS_BYTES[key](), dtype=torch.uint8, device=device)  # expect: FC106


def target_graph_workspace(cfg: SpecConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.target_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106


def verify_workspace(cfg: SpecConfig, device: torch.device) -> torch.Tensor:
    # shared by every verify wrapper of the process
    if "verify" not in _CACHE:
        _CACHE["verify"] = torch.empty(cfg.verify_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
    return _CACHE["verify"]


def draft_extend_workspace(cfg: SpecConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.extend_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
