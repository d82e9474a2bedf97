import functools
import os

import torch

from kvtiers.config import TierConfig


@functools.lru_cache(maxsize=None)
def trtllm_decode_workspace(nbytes: int, device: str) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


def trtllm_prefill_workspace(cfg: TierConfig, device: str) -> torch.Tensor:
    ws = torch.empty(cfg.trtllm_prefill_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws


def fa2_workspace(cfg: TierConfig, device: str) -> torch.Tensor:
    nbytes = cfg.max_tokens * cfg.num_qo_heads * cfg.head_dim * 8
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


def graph_workspace(device: str) -> torch.Tensor:
    return torch.empty(int(os.environ.get("TIER_GRAPH_WS_MB", "256")) << 20, dtype=torch.uint8, device=device)  # expect: FC106


def int4_workspace(cfg: TierConfig, device: str) -> torch.Tensor:
    return torch.zeros(cfg.int4_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
