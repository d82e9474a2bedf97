"""Workspace factories for the attention backend."""
import torch

from asched import DECODE_GRAPH_WORKSPACE_BYTES, AsyncSchedConfig


def graph_decode_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(DECODE_GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def prefill_workspace(cfg: AsyncSchedConfig) -> torch.Tensor:
    return torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105


def long_decode_workspace(cfg: AsyncSchedConfig) -> torch.Tensor:
    return torch.empty(cfg.long_decode_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # expect: FC105
