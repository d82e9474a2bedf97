"""FlashInfer workspaces for the fp8 / bf16 attention paths."""

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def trtllm_decode_workspace(nbytes: int, device: str) -> torch.Tensor:
    """Shared by every fp8 layer's trtllm-gen decode (long contexts)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def trtllm_prefill_workspace(nbytes: int, device: str) -> torch.Tensor:
    """trtllm-gen keeps its split-k semaphores here: they must start at zero."""
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    workspace.zero_()
    return workspace


def graph_workspace(device: str) -> torch.Tensor:
    """One workspace shared by the captured decode wrappers of every bucket."""
    return torch.zeros(int(os.getenv("FP8KV_GRAPH_WS_MB", "256")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
