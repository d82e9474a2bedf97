"""Workspaces of the decode paths that are not bucketed into graphs."""

import torch

from slora.config import SLoRAConfig


def long_ctx_workspace(cfg: SLoRAConfig, device: torch.device) -> torch.Tensor:
    """Workspace of the overflow decode wrapper (trtllm-gen on Blackwell, FA2 before)."""
    return torch.empty(cfg.long_ctx_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105


def zeroed_decode_workspace(cfg: SLoRAConfig, device: torch.device) -> torch.Tensor:
    """Workspace of trtllm-gen decode for adapter-free long requests; its counters must start at zero."""
    ws = torch.empty(cfg.long_ctx_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws
