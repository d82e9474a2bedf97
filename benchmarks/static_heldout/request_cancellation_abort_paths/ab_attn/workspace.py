from __future__ import annotations

import os

import torch

from abortable import EngineConfig


def decode_graph_workspace(device) -> torch.Tensor:
    nbytes = int(os.environ.get("ABORT_ENGINE_GRAPH_WS_MB", "192")) << 20
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # expect: FC106


def eager_decode_workspace(cfg: EngineConfig, device) -> torch.Tensor:
    nbytes = cfg.max_running_requests * cfg.num_qo_heads * cfg.head_dim * 4 * cfg.max_kv_splits + (8 << 20)
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # ok: FC106


def trtllm_prefill_workspace(cfg: EngineConfig, device) -> torch.Tensor:
    ws = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()  # trtllm-gen keeps its split-k counters here
    return ws
