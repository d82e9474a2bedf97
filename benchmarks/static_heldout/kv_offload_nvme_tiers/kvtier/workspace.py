"""Workspace factories shared by the attention wrappers."""

import functools

import torch


def make_workspace(nbytes: int, device, zeroed: bool = True) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        buf.zero_()
    return buf


@functools.lru_cache(maxsize=4)
def get_extend_workspace(nbytes: int, device: str) -> torch.Tensor:
    # one per device; the extend wrapper is rebuilt when the config is reloaded
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
