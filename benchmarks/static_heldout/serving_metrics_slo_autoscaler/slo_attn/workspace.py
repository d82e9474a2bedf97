import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from slo import SLOConfig


def graph_workspace(cfg: SLOConfig, device) -> torch.Tensor:
    # trtllm-gen bucket wrappers keep their semaphores here: must start zeroed
    return torch.zeros(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def eager_workspace(cfg: SLOConfig, device) -> torch.Tensor:
    return torch.empty(cfg.eager_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def make_eager_decode(ws: torch.Tensor, layout: str) -> BatchDecodeWithPagedKVCacheWrapper:
    return BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=True, backend="fa2")
