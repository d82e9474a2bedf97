from typing import Dict

import torch

from mpp import BackendConfig

_TRTLLM_MLA_WORKSPACES: Dict[str, torch.Tensor] = {}


def decode_workspace(cfg: BackendConfig, device: torch.device) -> torch.Tensor:
    # FA2 decode kernels: scratch for split-k partials, no counters
    return torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def prefill_workspace_bytes(cfg: BackendConfig) -> int:
    return cfg.max_num_tokens * cfg.num_heads * (cfg.head_dim + 1) * 4 * 2 + (16 << 20)


def trtllm_mla_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    key = str(device)
    if key not in _TRTLLM_MLA_WORKSPACES:
        _TRTLLM_MLA_WORKSPACES[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _TRTLLM_MLA_WORKSPACES[key]
