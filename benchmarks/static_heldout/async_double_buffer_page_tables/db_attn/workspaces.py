"""Workspace factories for the double-buffered backend."""

from __future__ import annotations

import torch

from dbuf.config import GRAPH_WS_TIERS, DoubleBufferConfig


def get_graph_workspace(cfg: DoubleBufferConfig, device: torch.device) -> torch.Tensor:
    # one per buffer set: the plan for the idle set must not touch the
    # workspace the replaying graph reads
    return torch.zeros(GRAPH_WS_TIERS[cfg.graph_tier()], dtype=torch.uint8, device=device)  # expect: FC106


def get_prefill_workspace(cfg: DoubleBufferConfig, device: torch.device) -> torch.Tensor:
    return torch.zeros(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106


def get_long_decode_workspace(cfg: DoubleBufferConfig, device: torch.device) -> torch.Tensor:
    # long rows run on trtllm-gen
    return torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105


def get_short_decode_workspace(cfg: DoubleBufferConfig, device: torch.device) -> torch.Tensor:
    # FA2 eager decode for batches above the largest bucket
    return torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
