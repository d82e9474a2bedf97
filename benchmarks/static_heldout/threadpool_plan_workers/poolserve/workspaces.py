"""Workspace factories shared by the attention module and the plan workers."""
import functools

import torch


def zeroed(nbytes: int, device: torch.device) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws


@functools.lru_cache(maxsize=None)
def draft_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
