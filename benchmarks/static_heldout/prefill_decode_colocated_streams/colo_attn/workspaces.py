"""Workspace sizing and allocation for the prefill side."""
from __future__ import annotations

import torch

from colo import EngineConfig


def prefill_workspace_bytes(cfg: EngineConfig) -> int:
    # Split-k partial outputs and LSEs for a full prefill chunk, with room for the plan tables.
    partial = cfg.max_prefill_tokens * cfg.num_qo_heads * (cfg.head_dim + 1) * 4
    return 4 * partial + (32 << 20)


def alloc_ctx_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
