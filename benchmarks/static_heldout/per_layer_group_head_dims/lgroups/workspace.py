"""Workspaces of the captured decode graphs, one per layer group."""
from __future__ import annotations

import torch

# measured peak of the decode planner at the largest bucket, per group kind
_GRAPH_WS_BYTES = {"local": 96 << 20, "global": 192 << 20}


def graph_workspace(kind: str, device: torch.device) -> torch.Tensor:
    return torch.zeros(_GRAPH_WS_BYTES[kind], dtype=torch.uint8, device=device)  # expect: FC106
