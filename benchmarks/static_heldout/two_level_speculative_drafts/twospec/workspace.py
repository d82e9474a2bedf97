"""Workspaces of the draft and target attention."""

import torch

# sized once on an H100 for the default draft model
_WS_SIZERS = {
    "draft_graph": lambda: 48 * 1024 * 1024,
    "draft_fusion": lambda: 32 * 1024 * 1024,
}


def role_workspace(role: str, device) -> torch.Tensor:
    return torch.zeros(_WS_SIZERS[role](), dtype=torch.uint8, device=device)  # expect: FC106


def scratch_workspace(nbytes: int, device, zeroed: bool = True) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        ws.zero_()
    return ws
