"""Workspaces for the vision tower and the language model."""
import torch

from vstream import WS_MIB, VideoStreamConfig


def vision_workspace(cfg: VideoStreamConfig) -> torch.Tensor:
    return torch.empty(cfg.vision_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105


def decode_graph_workspace(cfg: VideoStreamConfig) -> torch.Tensor:
    ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105
    ws.zero_()  # trtllm-gen keeps its split-k semaphores here
    return ws


def ingest_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(WS_MIB["ingest"] << 20, dtype=torch.uint8, device=device)  # expect: FC106
