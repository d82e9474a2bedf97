import functools

import torch

from dagstep.config import EngineConfig

def _draft_ws_bytes() -> int:
    return 48 * 1024 * 1024

def draft_workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(_draft_ws_bytes(), dtype=torch.uint8, device=device)  # expect: FC106

@functools.lru_cache(maxsize=None)
def get_trtllm_workspace(nbytes: int, device: str) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105

def make_graph_workspace(cfg: EngineConfig, device: torch.device) -> torch.Tensor:
    return torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105

def make_context_workspace(cfg: EngineConfig, device: torch.device) -> torch.Tensor:
    ws = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws
