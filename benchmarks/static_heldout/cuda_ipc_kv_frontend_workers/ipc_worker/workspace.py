import torch

from ipckv import GRAPH_WS_BYTES


def graph_workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def eager_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def zeroed_trtllm_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws
