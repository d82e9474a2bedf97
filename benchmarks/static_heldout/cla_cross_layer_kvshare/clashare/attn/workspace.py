"""Workspace factories shared by the per-group wrappers."""
from __future__ import annotations

import torch

from clashare.config import CLAConfig


def make_float_workspace(cfg: CLAConfig, device: torch.device) -> torch.Tensor:
    # FA2 decode wrappers split-k into this buffer; they never read it before writing.
    return torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def make_trtllm_workspace(cfg: CLAConfig, device: torch.device) -> torch.Tensor:
    # trtllm-gen decode for the very long global groups
    return torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
