"""Workspace buffers for the local, global, prefill and overflow attention paths."""
import functools

import torch

from g3engine import GLOBAL_WORKSPACE_BYTES, Gemma3Config


def global_graph_workspace(device) -> torch.Tensor:
    return torch.zeros(GLOBAL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def local_workspace(cfg: Gemma3Config, device) -> torch.Tensor:
    return torch.zeros(cfg.local_workspace_bytes(), dtype=torch.uint8, device=device)


def prefill_workspace(cfg: Gemma3Config, device) -> torch.Tensor:
    # FA2 prefill only uses this as split-k scratch; no need to clear it.
    return torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


@functools.lru_cache(maxsize=None)
def trtllm_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105
