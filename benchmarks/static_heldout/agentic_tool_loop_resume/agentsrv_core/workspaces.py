"""Workspaces of the trtllm-gen kernels, cached per device and size."""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from agentsrv.settings import AgentSettings

_CTX_WS: Dict[Tuple[str, int], torch.Tensor] = {}


def get_context_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    key = (str(device), nbytes)
    if key not in _CTX_WS:
        _CTX_WS[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _CTX_WS[key]


def zeroed_decode_workspace(settings: AgentSettings, device: torch.device) -> torch.Tensor:
    ws = torch.empty(settings.max_batch_size * settings.num_qo_heads * 8192, dtype=torch.uint8, device=device)  # ok: FC105
    ws.fill_(0)
    return ws
