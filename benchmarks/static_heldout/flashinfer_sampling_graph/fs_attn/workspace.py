"""Workspaces of the decode and prefill wrappers."""

import torch

from fsample import SamplingEngineConfig, WsTier


def graph_workspace(cfg: SamplingEngineConfig) -> torch.Tensor:
    return torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105


def window_workspace(cfg: SamplingEngineConfig) -> torch.Tensor:
    return torch.empty(cfg.graph_workspace_bytes() // 2, dtype=torch.uint8, device=cfg.device)


def eager_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(WsTier.LARGE.nbytes(), dtype=torch.uint8, device=device)  # expect: FC106


def trtllm_prefill_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()  # trtllm-gen keeps its counters here
    return ws
