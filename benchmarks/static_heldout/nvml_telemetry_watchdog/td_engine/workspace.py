import torch

_TRT_WS = None


def default_workspace_bytes() -> int:
    return 192 * 1024 * 1024


def trtllm_workspace(nbytes: int, device) -> torch.Tensor:
    global _TRT_WS
    if _TRT_WS is None:
        _TRT_WS = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _TRT_WS
