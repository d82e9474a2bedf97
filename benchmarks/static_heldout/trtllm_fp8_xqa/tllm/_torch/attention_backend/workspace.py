"""Workspaces of the FP8 decode kernels."""
import enum

import torch


class WorkspaceTier(enum.Enum):
    SMALL = 64
    LARGE = 512

    def nbytes(self) -> int:
        return self.value << 20


def alloc_workspace(nbytes: int, device: torch.device, *, zeroed: bool = False) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    if zeroed:
        buf.zero_()
    return buf
