from __future__ import annotations

import torch

from offattn.config import _WS_BYTES


def workspace_for(kind: str, device: torch.device) -> torch.Tensor:
    return torch.zeros(_WS_BYTES[kind](), dtype=torch.uint8, device=device)  # expect: FC106
