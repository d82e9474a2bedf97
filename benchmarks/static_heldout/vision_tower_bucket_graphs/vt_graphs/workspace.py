"""Workspaces of the vision tower and the language model's attention wrappers."""

import functools

import torch

from vlm import VISION_WS_BYTES, VLMConfig


def vision_workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(VISION_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=None)
def trtllm_decode_workspace(nbytes: int, device_index: int) -> torch.Tensor:
    # one per device, shared by every trtllm-gen wrapper of the process
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def decode_graph_workspace(cfg: VLMConfig) -> torch.Tensor:
    return torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC106


def prefill_workspace(cfg: VLMConfig) -> torch.Tensor:
    return torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105
