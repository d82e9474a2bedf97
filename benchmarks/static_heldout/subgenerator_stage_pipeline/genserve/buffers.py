"""Persistent buffers declared once in a class body and allocated lazily per instance.

``kv_indptr = DeviceBuffer(lambda s: (s.cfg.max_batch_size + 1,))`` declares a buffer; the first read on an
instance allocates it on ``instance.device`` and caches it in the instance's ``__dict__``. The descriptors are
non-data descriptors, so every later read finds the cached tensor without coming back here.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Dict, Optional, Tuple, Type

import torch

ShapeFn = Callable[[Any], Tuple[int, ...]]


class _LazyBuffer:
    def __init__(self, shape: ShapeFn, dtype: torch.dtype = torch.int32, fill: int = 0) -> None:
        self.shape = shape
        self.dtype = dtype
        self.fill = fill
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        owner.__lazy_buffers__ = (*getattr(owner, "__lazy_buffers__", ()), name)

    def _cached(self, obj: Any) -> Optional[torch.Tensor]:
        assert self.name, "buffer descriptor used outside a class body"  # ok: FC109
        return obj.__dict__.get(self.name)


class DeviceBuffer(_LazyBuffer):
    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        buf = self._cached(obj)
        if buf is None:
            buf = torch.full(self.shape(obj), self.fill, dtype=self.dtype, device=obj.device)
            obj.__dict__[self.name] = buf  # ok: FC107
        return buf


class HostBuffer(_LazyBuffer):
    """Pinned host twin of a device buffer, filled with numpy and uploaded with ``non_blocking=True``."""

    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        buf = self._cached(obj)
        if buf is None:
            buf = torch.full(self.shape(obj), self.fill, dtype=self.dtype, pin_memory=True)
            obj.__dict__[self.name] = buf
        return buf


def materialize(obj: Any) -> None:
    """Allocate every declared buffer now (before graph capture fixes their addresses)."""
    for name in getattr(type(obj), "__lazy_buffers__", ()):
        getattr(obj, name)


class BufferSet:
    """Named tensors of one dtype: ``BufferSet[torch.int64](input_ids=...)`` specialises the container."""

    dtype: ClassVar[Optional[torch.dtype]] = None
    _specialised: ClassVar[Dict[Tuple[type, torch.dtype], type]] = {}

    def __class_getitem__(cls, dtype: torch.dtype) -> Type["BufferSet"]:
        assert isinstance(dtype, torch.dtype), f"BufferSet[...] takes a torch.dtype, got {dtype!r}"  # expect: FC109
        key = (cls, dtype)
        spec = cls._specialised.get(key)
        if spec is None:
            spec = type(f"{cls.__name__}[{dtype}]", (cls,), {"dtype": dtype, "__module__": cls.__module__})
            cls._specialised[key] = spec
        return spec

    def __init__(self, **tensors: torch.Tensor) -> None:
        self._tensors: Dict[str, torch.Tensor] = {}
        for name, t in tensors.items():
            if self.dtype is not None and t.dtype is not self.dtype:
                raise TypeError(f"{type(self).__name__}: {name} has dtype {t.dtype}")
            self._tensors[name] = t

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __setitem__(self, name: str, t: torch.Tensor) -> None:
        self._tensors[name] = t

    def names(self) -> Tuple[str, ...]:
        return tuple(self._tensors)


class StepBuffers:
    """Per-step device inputs shared by the eager forward and the captured decode graphs."""

    input_ids = DeviceBuffer(lambda s: (s.cfg.max_num_tokens,), torch.int64)
    positions = DeviceBuffer(lambda s: (s.cfg.max_batch_size,), torch.int64)
    seq_lens = DeviceBuffer(lambda s: (s.cfg.max_batch_size,), torch.int32, fill=1)
    token_host = HostBuffer(lambda s: (s.cfg.max_batch_size,), torch.int64)

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
