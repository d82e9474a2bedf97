"""The trtllm-gen decode workspace, created on first use and shared by every caller."""

from typing import Optional

import torch

_TRT_WS: Optional[torch.Tensor] = None


def get_trtllm_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    global _TRT_WS
    if _TRT_WS is None or _TRT_WS.numel() < nbytes:
        _TRT_WS = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _TRT_WS
