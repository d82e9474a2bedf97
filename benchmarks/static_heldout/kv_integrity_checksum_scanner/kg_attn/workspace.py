"""A per-device cache of attention workspaces."""
from __future__ import annotations

from typing import Dict, Tuple

import torch

_WS_CACHE: Dict[Tuple[str, int], torch.Tensor] = {}


def cached_workspace(tag: str, nbytes: int, device: torch.device) -> torch.Tensor:
    key = (tag, device.index or 0)
    ws = _WS_CACHE.get(key)
    if ws is None or ws.numel() < nbytes:
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
        _WS_CACHE[key] = ws
    return ws
