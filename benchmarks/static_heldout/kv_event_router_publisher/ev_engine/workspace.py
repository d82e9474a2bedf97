from typing import Dict, Tuple

import torch

_WS_CACHE: Dict[Tuple[str, int], torch.Tensor] = {}


def context_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    key = (str(device), nbytes)
    if key not in _WS_CACHE:
        _WS_CACHE[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _WS_CACHE[key]
