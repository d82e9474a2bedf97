"""Workspaces: one per wrapper family, the trtllm one cached for the process."""
from typing import Dict

import torch

from convtree import ChatServerConfig, WsTier

_WS_CACHE: Dict[str, torch.Tensor] = {}


def cascade_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(WsTier.CASCADE, dtype=torch.uint8, device=device)  # expect: FC106


def decode_graph_workspace(cfg: ChatServerConfig) -> torch.Tensor:
    return torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC106


def edit_prefill_workspace(cfg: ChatServerConfig) -> torch.Tensor:
    ws = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105
    ws.zero_()
    return ws


def trtllm_decode_workspace(cfg: ChatServerConfig) -> torch.Tensor:
    if "trtllm" not in _WS_CACHE:
        _WS_CACHE["trtllm"] = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # expect: FC105
    return _WS_CACHE["trtllm"]
