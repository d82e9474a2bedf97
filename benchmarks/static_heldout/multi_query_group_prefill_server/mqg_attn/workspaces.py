import functools
import os

import torch

from mqg import ServerConfig


@functools.lru_cache(maxsize=None)
def trtllm_context_workspace(device_index: int, nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_index))  # expect: FC105


def ragged_workspace(device: torch.device) -> torch.Tensor:
    nbytes = int(os.environ.get("MQG_RAGGED_WORKSPACE_MB", "512")) << 20
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # expect: FC106


def prefix_workspace(cfg: ServerConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.prefix_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105


def decode_workspaces(cfg: ServerConfig, device: torch.device):
    graph_ws = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)
    eager_ws = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    eager_ws.zero_()  # trtllm-gen keeps its split-k semaphores here
    return graph_ws, eager_ws
