import torch

_WS_BYTES = {"decode": 128 << 20, "cascade": 64 << 20}

_EXTEND_WS = None


def decode_workspace(device):
    return torch.zeros(_WS_BYTES["decode"], dtype=torch.uint8, device=device)  # expect: FC106


def extend_workspace(nbytes, device):
    global _EXTEND_WS
    if _EXTEND_WS is None:
        _EXTEND_WS = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    return _EXTEND_WS
