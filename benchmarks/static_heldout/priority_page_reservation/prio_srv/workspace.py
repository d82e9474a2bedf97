from __future__ import annotations

import torch


def make_workspace(nbytes: int, device: torch.device, zeroed: bool = False) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        buf.zero_()
    return buf
