import os

import torch

from lckv import OffloadConfig


def decode_graph_workspace(cfg: OffloadConfig) -> torch.Tensor:
    ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105
    ws.zero_()  # trtllm-gen keeps its multi-CTA counters here
    return ws


def chunk_prefill_workspace(cfg: OffloadConfig) -> torch.Tensor:
    return torch.empty(cfg.chunk_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # expect: FC105


def summary_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(int(os.environ.get("LCKV_SUMMARY_WS_MB", "256")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
