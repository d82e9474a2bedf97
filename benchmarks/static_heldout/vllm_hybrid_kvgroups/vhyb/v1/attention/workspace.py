"""The workspace shared by the FlashInfer wrappers of every KV-cache group."""
import functools
import os

import torch

FLASHINFER_WORKSPACE_MIB = int(os.getenv("VLLM_FLASHINFER_WORKSPACE_MIB", "256"))
_MiB = 1 << 20


@functools.lru_cache(maxsize=None)
def get_shared_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(FLASHINFER_WORKSPACE_MIB * _MiB, dtype=torch.uint8, device=device)  # expect: FC106
