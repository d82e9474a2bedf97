"""Workspace factories: sized from the engine's limits, one per wrapper family."""

import torch

from ntkserve import NTKConfig


def decode_graph_workspace(cfg: NTKConfig, device) -> torch.Tensor:
    # FA2 decode kernels only read what plan() wrote into it
    return torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def prefill_workspace(cfg: NTKConfig, device) -> torch.Tensor:
    buf = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
    return buf
