import functools

import torch

from cgt import EAGER_DECODE_WORKSPACE_BYTES, ServingConfig


@functools.lru_cache(maxsize=None)
def trtllm_overflow_workspace(nbytes: int, device: str) -> torch.Tensor:
    # batches past the largest bucket go to trtllm-gen; one buffer per device
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def eager_decode_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(EAGER_DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def graph_workspace(cfg: ServingConfig) -> torch.Tensor:
    return torch.zeros(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC106


def prefill_workspace(cfg: ServingConfig) -> torch.Tensor:
    return torch.empty(cfg.prefill_workspace_bytes(cfg.max_prefill_tokens), dtype=torch.uint8, device=cfg.device)  # ok: FC105
