from __future__ import annotations

from typing import Dict

import torch

from ecache import ServerConfig

_WS_CACHE: Dict[str, torch.Tensor] = {}


def trtllm_context_workspace(cfg: ServerConfig, device) -> torch.Tensor:
    ws = _WS_CACHE.get("ctx")
    if ws is None:
        ws = torch.empty(cfg.ctx_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        _WS_CACHE["ctx"] = ws
    return ws


def fa2_prefill_workspace(cfg: ServerConfig, device) -> torch.Tensor:
    nbytes = cfg.max_prefill_tokens * cfg.num_qo_heads * cfg.head_dim * 8 + (32 << 20)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
