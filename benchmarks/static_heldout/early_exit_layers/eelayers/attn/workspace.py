"""Workspaces shared by the wrappers of a tier of layer groups."""

import functools

import torch

_GROUP_WS_MIB = {"shallow": 64, "deep": 256}


@functools.lru_cache(maxsize=None)
def get_group_workspace(tier: str, device: str) -> torch.Tensor:
    return torch.zeros(_GROUP_WS_MIB[tier] << 20, dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=1)
def get_trtllm_workspace(nbytes: int, device: str) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws
