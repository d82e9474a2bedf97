from __future__ import annotations

import torch

from reasoning.config import ReasoningConfig


def prefill_workspace(cfg: ReasoningConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.prefill_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def eager_workspace(cfg: ReasoningConfig, device: torch.device) -> torch.Tensor:
    return torch.zeros(cfg.eager_ws_bytes(), dtype=torch.uint8, device=device)
