"""Workspace factories shared by the target backend and the drafter (namespace folder: no __init__.py)."""

from __future__ import annotations

from typing import Dict

import torch

from kwstack import config as kw_config

_WS_CACHE: Dict[str, torch.Tensor] = {}


def alloc_workspace(nbytes: int, device, zeroed: bool = False) -> torch.Tensor:
    """Fresh workspace; callers that feed trtllm-gen kernels ask for ``zeroed=True``."""
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        ws.zero_()
    return ws


def get_cached_workspace(key: str, nbytes: int, device, **kwargs) -> torch.Tensor:
    """One workspace per key, grown on demand and shared by every caller that asks for that key."""
    ws = _WS_CACHE.get(key)
    if ws is None or ws.numel() < nbytes:
        ws = torch.empty(nbytes, dtype=kwargs.get("dtype", torch.uint8), device=device)  # expect: FC105
        _WS_CACHE[key] = ws
    return ws


def ragged_workspace(device) -> torch.Tensor:
    """Ragged prefill workspace; its size is set at start-up from the token budget."""
    return torch.zeros(kw_config.RAGGED_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # ok: FC106


def decode_workspace_bytes(max_bs: int, num_qo_heads: int, head_dim: int, max_splits: int = 32) -> int:
    """Split-k partial outputs (fp32) plus LSEs for the largest decode batch, with a 16 MiB floor."""
    partial = max_bs * num_qo_heads * max_splits * (head_dim + 1) * 4
    return max(partial * 2, 16 << 20)
