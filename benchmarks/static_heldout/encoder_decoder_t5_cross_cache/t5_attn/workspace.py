import torch

import t5serve
from t5serve import T5Config


def graph_workspace(cfg: T5Config, device) -> torch.Tensor:
    """Shared by both bucket families; the trtllm-gen cross kernels need it zeroed."""
    ws = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws


def encoder_workspace(device) -> torch.Tensor:
    return torch.zeros(t5serve.ENCODER_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def long_cross_workspace(cfg: T5Config, device) -> torch.Tensor:
    return torch.zeros(cfg.long_cross_workspace_bytes(), dtype=torch.uint8, device=device)
