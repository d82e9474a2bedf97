"""Workspaces of the two wrapper families."""

import functools
import os

import torch

from razor import RazorConfig


def full_graph_workspace(cfg: RazorConfig, device: torch.device) -> torch.Tensor:
    nbytes = cfg.max_batch_size * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 8 + (8 << 20)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC106


def comp_graph_workspace(device: torch.device) -> torch.Tensor:
    nbytes = int(os.getenv("RAZOR_COMP_GRAPH_WS_MB", "192")) << 20
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=None)
def eager_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def full_eager_workspace(cfg: RazorConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def compressed_decode_kwargs(cfg: RazorConfig) -> dict:
    kw = {"use_tensor_cores": True}
    if cfg.trtllm_compressed:
        kw["backend"] = "trtllm-gen"
    return kw
