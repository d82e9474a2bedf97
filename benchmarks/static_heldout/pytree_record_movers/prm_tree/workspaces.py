"""Workspace factories shared by the attention backends (namespace package)."""

from __future__ import annotations

import functools
import os

import torch

# Per-kind FA2 workspace sizes of the first prototype.
_WS_TIERS = {"decode": 64 << 20, "prefill": 384 << 20}


def float_workspace(kind: str, device) -> torch.Tensor:
    return torch.zeros(_WS_TIERS[kind], dtype=torch.uint8, device=device)  # expect: FC106


def sized_workspace(max_num_tokens: int, num_qo_heads: int, head_dim: int, device) -> torch.Tensor:
    # split-k partial outputs (fp32 o + lse) for the largest step, doubled for the two plan stages
    nbytes = max(2 * max_num_tokens * num_qo_heads * (head_dim + 1) * 4, 16 << 20)
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # ok: FC106


def cascade_workspace(device) -> torch.Tensor:
    nbytes = int(os.environ.get("PRM_CASCADE_WS_MB", "256")) << 20
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=None)
def trtllm_decode_workspace(device_index: int, nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


@functools.lru_cache(maxsize=None)
def trtllm_context_workspace(device_index: int, nbytes: int) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # ok: FC105
    ws.zero_()
    return ws
