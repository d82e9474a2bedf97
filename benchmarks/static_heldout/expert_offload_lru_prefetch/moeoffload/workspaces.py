import functools

import torch

from .config import PREFILL_WS_BYTES


def prefill_workspace(device):
    workspace = torch.zeros(PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
    return workspace


@functools.lru_cache(maxsize=4)
def trtllm_long_workspace(nbytes, device):
    # shared by every layer's long-context decode; the kernel keeps its split counters here
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
