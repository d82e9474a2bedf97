import torch

from fincore.limits import GRAPH_WS_MB, WS_MIB, ServeLimits, WsSize, _WS_BYTES

_TRT_WS = None


def trtllm_workspace(limits: ServeLimits, device: torch.device) -> torch.Tensor:
    global _TRT_WS
    if _TRT_WS is None:
        _TRT_WS = torch.empty(limits.split_kv_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
    return _TRT_WS


def prefill_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(WS_MIB * 1024 * 1024, dtype=torch.uint8, device=device)  # expect: FC106


def ragged_workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(WsSize.PREFILL, dtype=torch.uint8, device=device)  # expect: FC106


def cascade_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(_WS_BYTES["cascade"], dtype=torch.uint8, device=device)  # expect: FC106


def verify_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(GRAPH_WS_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
