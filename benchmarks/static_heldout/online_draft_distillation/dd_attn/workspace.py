"""Workspaces of the draft and target attention."""
import torch

from distill import DistillConfig


def _draft_graph_ws_bytes() -> int:
    return 96 * 1024 * 1024


def draft_graph_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(_draft_graph_ws_bytes(), dtype=torch.uint8, device=device)  # expect: FC106


def draft_train_workspace(cfg: DistillConfig) -> torch.Tensor:
    return torch.empty(cfg.train_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105


def verify_workspace(cfg: DistillConfig) -> torch.Tensor:
    return torch.zeros(cfg.verify_workspace_bytes(), dtype=torch.uint8, device=cfg.device)
