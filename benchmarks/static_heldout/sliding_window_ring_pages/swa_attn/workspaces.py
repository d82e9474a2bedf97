import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def trtllm_workspace(nbytes: int, device: str) -> torch.Tensor:
    # shared by every global layer's long-context trtllm-gen decode
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def fa2_decode_workspace(nbytes: int, device: str) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


def graph_workspace(device: str) -> torch.Tensor:
    return torch.zeros(int(os.environ.get("SWA_GRAPH_WS_MB", "128")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
