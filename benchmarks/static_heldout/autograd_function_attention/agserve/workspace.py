"""Workspace buffers handed to FlashInfer wrappers and kernels."""

import torch

from .config import MLA_WORKSPACE_BYTES, EngineConfig


def make_float_workspace(cfg: EngineConfig, device: torch.device) -> torch.Tensor:
    # shared by the FA2 decode wrapper and every CUDA-graph decode wrapper
    return torch.zeros(cfg.float_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106


def make_prefill_workspace(cfg: EngineConfig, device: torch.device) -> torch.Tensor:
    # the ragged prefill runs on the FA2 backend, which overwrites its scratch before reading it
    return torch.empty(cfg.float_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def make_mla_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(MLA_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def make_trtllm_workspace(cfg: EngineConfig, device: torch.device) -> torch.Tensor:
    # trtllm-gen decode: allocated once, reused by every layer
    return torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105


def make_xqa_workspace(cfg: EngineConfig, device: torch.device) -> torch.Tensor:
    ws = torch.empty(cfg.xqa_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()  # XQA keeps its CTA counters here
    return ws
