import torch

from mfserve.config import SPARSE_WORKSPACE_BYTES, MInferenceConfig


def sparse_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(SPARSE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def decode_workspace(cfg: MInferenceConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def prefill_workspace(cfg: MInferenceConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106


def context_workspace(cfg: MInferenceConfig, device: torch.device) -> torch.Tensor:
    # trtllm-gen context kernels on Blackwell for the dense fallback
    return torch.empty(cfg.context_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
