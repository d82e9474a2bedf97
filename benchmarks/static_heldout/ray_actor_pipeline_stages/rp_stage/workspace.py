from typing import Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

_OVERFLOW_WS: Optional[torch.Tensor] = None


def overflow_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """Shared by every eager trtllm-gen decode this actor runs."""
    global _OVERFLOW_WS
    if _OVERFLOW_WS is None:
        _OVERFLOW_WS = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _OVERFLOW_WS


def graph_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws


def build_local_wrapper(workspace: torch.Tensor, layout: str) -> BatchDecodeWithPagedKVCacheWrapper:
    # sliding-window layers: one wrapper, re-planned per micro-batch
    return BatchDecodeWithPagedKVCacheWrapper(workspace, layout, use_tensor_cores=True)
