"""Per-rank FlashInfer workspaces."""
from __future__ import annotations

import os
from typing import Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from tpdist.config import TPConfig

_OVERFLOW_WS: Optional[torch.Tensor] = None


def graph_workspace(cfg: TPConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.graph_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def prefill_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(int(os.getenv("TP_FI_PREFILL_WS_MB", "512")) << 20, dtype=torch.uint8, device=device)  # expect: FC106


def overflow_workspace(cfg: TPConfig, device: torch.device) -> torch.Tensor:
    global _OVERFLOW_WS
    if _OVERFLOW_WS is None:
        _OVERFLOW_WS = torch.empty(cfg.overflow_ws_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
    return _OVERFLOW_WS


def make_overflow_decode(cfg: TPConfig, device: torch.device, layout: str) -> BatchDecodeWithPagedKVCacheWrapper:
    """Eager decode for batches above the largest captured bucket."""
    return BatchDecodeWithPagedKVCacheWrapper(overflow_workspace(cfg, device), layout, backend="trtllm-gen")
