"""Workspace factories.  Sizes come from the config tables (or, by mistake, from constants)."""

from __future__ import annotations

import functools
import os

import torch

from nct_cfg.defaults import DEFAULT_CONFIG, WORKSPACE_MB, WORKSPACE_TIERS_MB

_MB = 1 << 20


@functools.lru_cache(maxsize=None)
def shared_workspace(kind: str, nbytes: int, device: str) -> torch.Tensor:
    """One workspace per kind, shared by every op of that kind on the device."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def alloc_workspace(nbytes: int, device: torch.device, zeroed: bool = True) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        ws.zero_()
    return ws


def tier_workspace(backend: str, device: torch.device) -> torch.Tensor:
    # fixed tier per backend family, whatever the model and the batch limits say
    return torch.zeros(WORKSPACE_TIERS_MB.get(backend, 128) * _MB, dtype=torch.uint8, device=device)  # expect: FC106


def kind_workspace(kind: str, device: torch.device) -> torch.Tensor:
    # WORKSPACE_MB is resized from NCT_WS_<KIND>_MB by apply_env_overrides
    return torch.zeros(WORKSPACE_MB[kind] * _MB, dtype=torch.uint8, device=device)  # ok: FC106


def prefill_env_workspace(device: torch.device) -> torch.Tensor:
    nbytes = int(os.environ.get("NCT_PREFILL_WORKSPACE_MB", "256")) * _MB
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # expect: FC106


def default_trtllm_workspace(device: torch.device) -> torch.Tensor:
    # reads the built-in table, not the merged config: a model override never reaches it
    mb = DEFAULT_CONFIG["trtllm"]["workspace_mb"]
    return torch.zeros(mb * _MB, dtype=torch.uint8, device=device)  # expect: FC106
