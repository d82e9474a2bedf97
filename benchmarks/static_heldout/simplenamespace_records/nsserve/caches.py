"""Process-wide lazy caches keyed by shape.

Workspaces are shared by every wrapper that asks for the same (kind, bytes, device), and small host
tensors that every step needs (``arange`` indptrs for capture dummies, all-ones last-page lengths)
are built once per length.  Everything is ``dict.setdefault``: first use builds, later uses find.
"""

from __future__ import annotations

from typing import Any

import torch

_WORKSPACES: dict[tuple[Any, ...], torch.Tensor] = {}
_HOST_ARANGE: dict[int, torch.Tensor] = {}
_HOST_ONES: dict[int, torch.Tensor] = {}


def workspace_for(kind: str, nbytes: int, device: torch.device) -> torch.Tensor:
    """A float workspace shared by every wrapper of ``kind`` on ``device``."""
    key = (kind, int(nbytes), str(device))
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _WORKSPACES.setdefault(key, torch.empty(nbytes, dtype=torch.uint8, device=device))  # expect: FC105
    return ws


def zeroed_workspace_for(kind: str, nbytes: int, device: torch.device) -> torch.Tensor:
    """Like ``workspace_for`` but zero-initialised, for kernels that keep counters in it."""
    key = ("zeroed", kind, int(nbytes), str(device))
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _WORKSPACES.setdefault(key, torch.zeros(nbytes, dtype=torch.uint8, device=device))  # ok: FC105
    return ws


def host_arange(n: int) -> torch.Tensor:
    """``[0, 1, ..., n - 1]`` as a pinned int32 host tensor, cached per length."""
    return _HOST_ARANGE.setdefault(n, torch.arange(n, dtype=torch.int32).pin_memory())


def host_ones(n: int) -> torch.Tensor:
    return _HOST_ONES.setdefault(n, torch.ones(n, dtype=torch.int32).pin_memory())


def workspace_bytes_in_use() -> dict[str, int]:
    out: dict[str, int] = {}
    for key, ws in _WORKSPACES.items():
        name = ":".join(str(k) for k in key[:-1])
        out[name] = out.get(name, 0) + ws.numel()
    return out


def clear() -> None:
    _WORKSPACES.clear()
    _HOST_ARANGE.clear()
    _HOST_ONES.clear()
