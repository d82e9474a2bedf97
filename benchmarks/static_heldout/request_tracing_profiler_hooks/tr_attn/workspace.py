from __future__ import annotations

from dataclasses import dataclass

import torch

from tr_attn.config import TraceEngineConfig

_DECODE_WS_BYTES = lambda: 256 << 20  # noqa: E731


@dataclass
class WorkspacePool:
    decode_workspace: torch.Tensor
    prefill_workspace: torch.Tensor
    eager_workspace: torch.Tensor
    trt_workspace: torch.Tensor


def make_workspace_pool(cfg: TraceEngineConfig, device: torch.device) -> WorkspacePool:
    decode_workspace = torch.zeros(_DECODE_WS_BYTES(), dtype=torch.uint8, device=device)  # expect: FC106
    prefill_workspace = torch.empty(cfg.prefill_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    eager_workspace = torch.zeros(cfg.eager_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
    trt_workspace = torch.empty(cfg.trt_ws_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
    return WorkspacePool(decode_workspace, prefill_workspace, eager_workspace, trt_workspace)
