"""Workspace factories shared by every backend that asks for the same kind on the same device."""
import functools
from typing import Dict

import torch

from .config import _WS_TIERS, DECODE_WS_MIB, ServeConfig, trtllm_workspace_bytes

_XQA_CACHE: Dict[str, torch.Tensor] = {}


@functools.lru_cache(maxsize=None)
def get_decode_workspace(device: str) -> torch.Tensor:
    return torch.empty(DECODE_WS_MIB << 20, dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=None)
def get_prefill_workspace(device: str) -> torch.Tensor:
    return torch.empty(_WS_TIERS[1], dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=None)
def get_trtllm_workspace(device: str) -> torch.Tensor:
    return torch.zeros(trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106


def xqa_scratch(cfg: ServeConfig, key: str = "xqa") -> torch.Tensor:
    if key not in _XQA_CACHE:
        _XQA_CACHE[key] = torch.empty(cfg.max_batch * cfg.num_qo_heads * 8192, dtype=torch.uint8, device=cfg.device)  # expect: FC105
    return _XQA_CACHE[key]
