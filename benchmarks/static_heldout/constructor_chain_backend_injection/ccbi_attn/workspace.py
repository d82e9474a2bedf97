"""Workspace buffers for the backends; the shared size is set once the engine knows its limits."""

from __future__ import annotations

import torch

from ccbi.config import EngineConfig

SHARED_WS_BYTES = 256 * 1024 * 1024


def configure_workspace(cfg: EngineConfig) -> int:
    global SHARED_WS_BYTES
    SHARED_WS_BYTES = max(cfg.workspace_bytes(), cfg.decode_workspace_bytes)
    return SHARED_WS_BYTES


def float_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


def trtllm_workspace(nbytes: int, device: torch.device, zeroed: bool = False) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    if zeroed:
        buf.zero_()
    return buf
