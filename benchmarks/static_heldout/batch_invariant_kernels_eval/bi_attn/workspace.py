import torch

from bieval import InvariantConfig


def graph_workspace(cfg: InvariantConfig) -> torch.Tensor:
    return torch.zeros(cfg.graph_workspace_bytes, dtype=torch.uint8, device=cfg.device)  # ok: FC106


def prefill_workspace(cfg: InvariantConfig) -> torch.Tensor:
    return torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105


def swa_workspace(cfg: InvariantConfig) -> torch.Tensor:
    ws = torch.empty(cfg.swa_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105
    ws.fill_(0)  # trtllm-gen semaphores start at zero
    return ws
