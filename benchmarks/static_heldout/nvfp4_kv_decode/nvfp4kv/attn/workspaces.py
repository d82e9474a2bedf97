"""Workspaces of the decode kernels.

XQA and trtllm-gen keep multi-CTA semaphores in their workspace; the FA2
wrappers only keep split-k partials there.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from nvfp4kv.limits import QuantLimits

_WS_CACHE: Dict[Tuple[str, int], torch.Tensor] = {}
# trtllm-gen's and XQA's own recommendation, from the kernel READMEs
_WS_BYTES = {"trtllm-gen": lambda: 128 << 20, "xqa": lambda: 64 << 20}


def _partials(limits: QuantLimits) -> int:
    return limits.max_batch_size * limits.num_qo_heads * limits.max_kv_splits * (limits.head_dim + 2) * 4


def xqa_workspace(limits: QuantLimits, device: torch.device) -> torch.Tensor:
    key = ("xqa", device.index or 0)
    if key not in _WS_CACHE:
        _WS_CACHE[key] = torch.empty(_partials(limits), dtype=torch.uint8, device=device)  # expect: FC105
    return _WS_CACHE[key]


def trtllm_workspace(kind: str, device: torch.device) -> torch.Tensor:
    return torch.zeros(_WS_BYTES[kind](), dtype=torch.uint8, device=device)  # expect: FC106


def wrapper_workspace(limits: QuantLimits, device: torch.device) -> torch.Tensor:
    return torch.empty(_partials(limits), dtype=torch.uint8, device=device)  # expect: FC105


def dequant_workspace(limits: QuantLimits, device: torch.device) -> torch.Tensor:
    # a separate buffer, so the FA2 fallback never shares partials with a replaying graph
    return torch.empty(_partials(limits), dtype=torch.uint8, device=device)  # ok: FC105
