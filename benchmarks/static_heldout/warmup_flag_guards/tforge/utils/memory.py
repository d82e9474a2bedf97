from __future__ import annotations

import torch


def alloc_buffer(nbytes: int, device: torch.device | str, *, zero: bool = False,
                 dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """Uninitialised device scratch; pass zero=True for kernels that need zeros."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    buf = torch.empty(nbytes // itemsize, dtype=dtype, device=device)  # expect: FC105
    if zero:
        buf.zero_()
    return buf


def device_sm(device: torch.device | str) -> int:
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor
