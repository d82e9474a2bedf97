"""Workspaces of the decode graphs, the shared-prefix cascade and the admission prefill."""

import torch

from kvbatch import BatcherConfig, knobs


def decode_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(knobs.decode_ws_bytes, dtype=torch.uint8, device=device)  # expect: FC106


def cascade_workspace(cfg: BatcherConfig) -> torch.Tensor:
    return torch.empty(cfg.cascade_ws_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105


def admission_workspace(cfg: BatcherConfig) -> torch.Tensor:
    return torch.empty(cfg.prefill_ws_bytes(), dtype=torch.uint8, device=cfg.device)  # expect: FC105
