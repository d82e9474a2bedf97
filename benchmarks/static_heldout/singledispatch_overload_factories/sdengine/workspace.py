"""Workspace recipes dispatched on the config class, and cached per-device workspace constructors."""
import functools
import os

import torch

from .config import AttentionConfig, DecodeConfig, FLOAT_WORKSPACE_BYTES, PrefillConfig, TrtllmConfig


@functools.singledispatch
def make_workspace(cfg: AttentionConfig, device: torch.device) -> torch.Tensor:
    raise TypeError(f"no workspace recipe registered for {type(cfg).__name__}")


@make_workspace.register
def _(cfg: DecodeConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(FLOAT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


@make_workspace.register
def _(cfg: PrefillConfig, device: torch.device) -> torch.Tensor:
    nbytes = int(os.getenv("SD_RAGGED_WS_MB", "256")) << 20
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC106


@make_workspace.register
def _(cfg: TrtllmConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105


@functools.cache
def shared_float_workspace(device: str, nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


@functools.cache
def draft_workspace(device: str, nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
