"""Workspaces shared by every backend instance on a device, keyed by layout and size."""

import torch

_WS_CACHE = {}


def get_layout_workspace(layout: str, nbytes: int, device):
    key = (layout, nbytes, str(device))
    ws = _WS_CACHE.get(key)
    if ws is None:
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
        _WS_CACHE[key] = ws
    return ws
