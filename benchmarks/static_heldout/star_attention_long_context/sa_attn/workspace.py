"""Workspaces of the Star Attention backend."""

import torch

from staratt import ANCHOR_WORKSPACE_BYTES, StarConfig


def anchor_workspace(device: torch.device) -> torch.Tensor:
    """Shared by the phase-1 ragged prefill and the phase-2 multi-token query prefill."""
    return torch.empty(ANCHOR_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def query_workspace(cfg: StarConfig, device: torch.device) -> torch.Tensor:
    """The eager phase-2 decode (batches beyond the largest bucket)."""
    return torch.empty(cfg.query_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105


def graph_workspace(cfg: StarConfig, bucket: int, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.graph_workspace_bytes(bucket), dtype=torch.uint8, device=device)  # ok: FC106


def remote_decode_workspace(cfg: StarConfig, device: torch.device) -> torch.Tensor:
    """Scratch of the trtllm-gen kernel that serves queries forwarded by the other hosts."""
    ws = torch.empty(cfg.query_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws
