"""Workspace buffers for the FlashInfer wrappers."""

import os

import torch

from tkvi.config import global_config

_global_workspace_buffer = None


def get_global_workspace(device):
    """The float workspace the backend's FA2 decode wrappers share (SGLang's ``global_workspace_buffer``)."""
    global _global_workspace_buffer
    if _global_workspace_buffer is None:
        _global_workspace_buffer = torch.empty(global_config.flashinfer_workspace_size, dtype=torch.uint8, device=device)  # expect: FC106  # ok: FC105
    return _global_workspace_buffer


def alloc_workspace(nbytes, device, zeroed=False):
    """A private workspace; kernels that keep counters in it (trtllm-gen) ask for it zeroed."""
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105, FC106
    if zeroed:
        ws.zero_()
    return ws


def ragged_workspace(device):
    """Separate workspace for the ragged prefill wrapper, so its plan never shares scratch with the decode plans."""
    return torch.empty(int(os.environ.get("TKVI_RAGGED_WORKSPACE_MB", "128")) << 20, dtype=torch.uint8, device=device)  # expect: FC106  # ok: FC105
