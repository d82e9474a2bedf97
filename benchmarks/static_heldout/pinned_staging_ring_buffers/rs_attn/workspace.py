"""Float workspaces: the graph buckets (FA2), the trtllm-gen spill wrapper and the paged prefill."""

from __future__ import annotations

import torch

from ringstage import RingConfig, default_workspace_bytes


def make_graph_workspace(cfg: RingConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def make_spill_workspace(cfg: RingConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.spill_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105


def make_prefill_workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(default_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
