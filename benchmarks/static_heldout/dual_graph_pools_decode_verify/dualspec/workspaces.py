"""One float workspace per graph pool: the pools never run at once, but their plans must not alias."""

import functools

import torch


@functools.lru_cache(maxsize=None)
def pool_workspace(pool: str, nbytes: int, device: str):
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
