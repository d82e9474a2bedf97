"""Separate workspaces per stream: a wrapper's plan lives in its workspace, and the two
streams plan and run concurrently."""

import os

import torch

from overlap import OverlapConfig


class StreamWorkspaces:
    def __init__(self, cfg: OverlapConfig, device: torch.device):
        self.eager = {
            "prefill": torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device),  # ok: FC105
            "handoff": torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device),
        }
        trt = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        trt.zero_()
        self.trtllm = trt
        self.graph = torch.zeros(int(os.getenv("OVERLAP_GRAPH_WS_MB", "128")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
