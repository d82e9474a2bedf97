"""Workspace factories shared by the MLA backends (SGLang-style global buffers)."""

import functools
import os

import torch

_FA2_WORKSPACE: dict = {}


@functools.lru_cache(maxsize=None)
def get_trtllm_mla_workspace(device: str):
    size = int(os.environ.get("SGLANG_FI_MLA_WS_MB", "256")) << 20
    return torch.empty(size, dtype=torch.uint8, device=device)  # expect: FC105, FC106


def get_fa2_workspace(device: str, max_tokens: int, num_heads: int):
    if device not in _FA2_WORKSPACE:
        nbytes = max_tokens * num_heads * 512 * 4
        _FA2_WORKSPACE[device] = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105, FC106
    return _FA2_WORKSPACE[device]
