"""Device buffers created on first access, on the owner's device, and kept in the instance dict."""

from __future__ import annotations

from typing import Any, Callable, Tuple

import torch


class DeviceBuffer:
    def __init__(self, shape: Callable[[Any], Tuple[int, ...]], dtype: torch.dtype = torch.int32, fill: int = 0):
        assert callable(shape), "shape must be a function of the owner"  # expect: FC109
        self.shape, self.dtype, self.fill, self.name = shape, dtype, fill, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type = None) -> torch.Tensor:
        if obj is None:
            return self
        buf = obj.__dict__.get(self.name)  # ok: FC103
        if buf is None:
            buf = torch.full(self.shape(obj), self.fill, dtype=self.dtype, device=obj.device)  # ok: FC107
            obj.__dict__[self.name] = buf
        return buf


def scratch_workspace(nbytes: int, device: torch.device, zeroed: bool = False) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
    if zeroed:
        buf.zero_()
    return buf
