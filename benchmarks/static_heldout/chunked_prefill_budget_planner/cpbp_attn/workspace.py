"""FlashInfer float workspaces for the three wrapper families."""

import torch

from cpbp import MIXED_PREFILL_WS_BYTES, SchedulerConfig


def make_prefill_workspace(device: torch.device) -> torch.Tensor:
    # shared by the mixed-step prefill wrapper and the shared-prefix wrapper (FA2)
    return torch.empty(MIXED_PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def make_decode_workspace(cfg: SchedulerConfig, device: torch.device) -> torch.Tensor:
    # the eager decode wrapper may run on trtllm-gen, which keeps its counters here
    ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws


def make_graph_workspace(cfg: SchedulerConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
