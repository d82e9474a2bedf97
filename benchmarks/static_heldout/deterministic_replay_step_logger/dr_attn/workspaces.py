"""Workspaces of the eager wrappers, sized from the engine's limits."""

from __future__ import annotations

import torch

from dr_engine.config import EngineConfig


def prefill_workspace(cfg: EngineConfig, device: torch.device) -> torch.Tensor:
    # FA2 prefill, also lent to the deterministic decode (they never overlap)
    return torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def trtllm_decode_workspace(cfg: EngineConfig, device: torch.device) -> torch.Tensor:
    ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()  # trtllm-gen keeps its semaphores here
    return ws
