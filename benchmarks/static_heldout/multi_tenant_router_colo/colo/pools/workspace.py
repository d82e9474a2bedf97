"""FlashInfer float workspaces, one per size tier.

Colocated tenants of one tier never run in the same step (the router switches
tenants between steps), so they can share one float workspace.
"""
from __future__ import annotations

import functools

import torch

from colo.tenants import _TENANT_WS_MIB


@functools.lru_cache(maxsize=None)
def get_tenant_workspace(tier: str, device_index: int = 0) -> torch.Tensor:
    return torch.empty(_TENANT_WS_MIB[tier] << 20, dtype=torch.uint8, device=f"cuda:{device_index}")  # expect: FC106


def workspace_tiers() -> list:
    return sorted(_TENANT_WS_MIB)
