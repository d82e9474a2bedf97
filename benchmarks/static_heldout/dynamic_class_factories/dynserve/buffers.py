"""Per-instance tensors declared in class bodies.

A backend is assembled from mixins at start-up, so each feature declares the buffers it needs next to
its code instead of in one large ``__init__``: the descriptor learns its attribute name from
``__set_name__`` and allocates on first access, sized from an attribute of the owner (``max_bs``...).
Assigning the attribute replaces the storage (``__set__``), which is how capacity grows.
"""

from __future__ import annotations

from typing import Optional

import torch


class _BufferDescriptor:
    def __init__(self, size: str, *, dtype: torch.dtype = torch.int32, extra: int = 0,
                 fill: Optional[int] = None) -> None:
        self.size = size
        self.dtype = dtype
        self.extra = extra
        self.fill = fill
        self.name = ""
        self.slot = ""

    def __set_name__(self, owner: type, name: str) -> None:
        assert not name.startswith("_"), f"buffer {name!r} must be public: its slot is derived from it"  # expect: FC109
        self.name = name
        self.slot = f"_buf_{name}"
        declared = owner.__dict__.get("declared_buffers")
        if declared is None:
            declared = {}
            setattr(owner, "declared_buffers", declared)
        declared[name] = self

    def numel(self, obj) -> int:
        return getattr(obj, self.size) + self.extra

    def _allocate(self, obj) -> torch.Tensor:
        raise NotImplementedError

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        buf = obj.__dict__.get(self.slot)
        if buf is None:
            buf = self._allocate(obj)
            obj.__dict__[self.slot] = buf
        return buf

    def __set__(self, obj, value: torch.Tensor) -> None:
        obj.__dict__[self.slot] = value


class DeviceBuffer(_BufferDescriptor):
    """A persistent device tensor on ``obj.device`` (graph wrappers bind these)."""

    def _allocate(self, obj) -> torch.Tensor:
        n = self.numel(obj)
        if self.fill is None:
            return torch.zeros(n, dtype=self.dtype, device=obj.device)
        return torch.full((n,), self.fill, dtype=self.dtype, device=obj.device)


class PinnedMirror(_BufferDescriptor):
    """A pinned host tensor, filled with numpy on the CPU and handed to ``plan()``."""

    def _allocate(self, obj) -> torch.Tensor:
        buf = torch.zeros(self.numel(obj), dtype=self.dtype, pin_memory=True)
        if self.fill is not None:
            buf.fill_(self.fill)
        return buf


class HostView:
    """A host copy of a device field, for scheduling decisions and kernel arguments that want ints.

    ``batch.host_seq_lens`` reads like the pinned mirrors, but it copies on every access.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return getattr(obj, self.source).cpu()  # expect: FC101
