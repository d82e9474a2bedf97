"""Workspace factories for the soft-prompt attention backend."""

import torch

from .config import SoftPromptConfig, WsTier


def decode_workspace(cfg: SoftPromptConfig) -> torch.Tensor:
    # FA2 decode kernels overwrite their split-k scratch before reading it
    return torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105


def long_prefill_workspace(cfg: SoftPromptConfig) -> torch.Tensor:
    ws = torch.empty(cfg.long_prefill_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # expect: FC105
    return ws


def ragged_workspace(device) -> torch.Tensor:
    return torch.zeros(WsTier.LARGE, dtype=torch.uint8, device=device)  # expect: FC106
