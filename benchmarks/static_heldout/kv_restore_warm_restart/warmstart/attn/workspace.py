from __future__ import annotations

import torch


def alloc_workspace(nbytes: int, device: torch.device, zeroed: bool = False) -> torch.Tensor:
    """One flat byte workspace. Planner-backed wrappers overwrite what they use, so zeroing is
    opt-in (it costs a memset of a few hundred MiB at start-up and again after every restore)."""
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    if zeroed:
        ws.zero_()
    return ws
