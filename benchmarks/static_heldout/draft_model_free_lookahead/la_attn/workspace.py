"""Workspaces: the verify prefill (FA2), the graph decode buckets and the eager decode (trtllm-gen)."""

from __future__ import annotations

import torch

from lookahead import LookaheadConfig


def make_graph_workspace(cfg: LookaheadConfig, device: torch.device) -> torch.Tensor:
    ws = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws


def make_trt_decode_workspace(cfg: LookaheadConfig, device: torch.device, zero_init: bool = False) -> torch.Tensor:
    ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
    if zero_init:
        ws.zero_()
    return ws


class VerifyWorkspaces:
    VERIFY_WS_BYTES = 384 * 1024 * 1024

    def __init__(self, cfg: LookaheadConfig, device: torch.device):
        self.verify = torch.empty(self.VERIFY_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph = make_graph_workspace(cfg, device)
        self.eager_decode = make_trt_decode_workspace(cfg, device)
