"""FlashInfer float workspaces: per-family eager decode, shared graph decode, window decode, prefill."""

from __future__ import annotations

from typing import Iterable

import torch

from mfserve import FamilySpec, ServeConfig, WsTier


def make_prefill_workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(WsTier.PREFILL, dtype=torch.uint8, device=device)  # expect: FC106


def make_decode_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def make_graph_workspace(cfg: ServeConfig, specs: Iterable[FamilySpec], device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.graph_workspace_bytes(specs), dtype=torch.uint8, device=device)  # ok: FC105


def make_window_workspace(cfg: ServeConfig, device: torch.device) -> torch.Tensor:
    return torch.zeros(cfg.window_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
