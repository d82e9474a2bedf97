import torch

from plp.config import LogprobConfig


def default_graph_workspace_bytes() -> int:
    return 192 * 1024 * 1024


def make_prefill_workspace(cfg: LogprobConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105


def make_decode_workspace(cfg: LogprobConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
