"""Workspaces of the mixed backend, one object holding all of them."""

from dataclasses import dataclass

import torch

from ..config import BudgetConfig


@dataclass
class MixedWorkspaces:
    decode: torch.Tensor
    window: torch.Tensor
    context: torch.Tensor


def make_workspaces(cfg: BudgetConfig) -> MixedWorkspaces:
    return MixedWorkspaces(
        decode=torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=cfg.device),  # ok: FC105
        window=torch.zeros(cfg.window_workspace_bytes(), dtype=torch.uint8, device=cfg.device),
        context=torch.empty(cfg.context_workspace_bytes(), dtype=torch.uint8, device=cfg.device),  # expect: FC105
    )


def wrapper_summary(w) -> str:
    return f"{type(w).__name__}(backend={w._backend})"  # expect: FC103
