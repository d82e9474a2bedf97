"""Descriptors that own the engine's persistent tensors.

A backend, the graph runner or the drafter declares each persistent tensor once, in its
class body::

    class FlashInferAttnBackend(AttnBackendBase):
        kv_indptr = DeviceBuffer(lambda o: o.max_bs + 1)
        kv_indptr_cpu = PinnedMirror(lambda o: o.max_bs + 1)
        kv_indptr_np = HostView("kv_indptr_cpu")

The descriptor learns its attribute name from ``__set_name__``, keeps the tensor in a
per-instance slot (``_dm_<name>``; a class with ``__slots__`` lists those through
``descriptor_slots``) and allocates it on first access from the owner's limits, so that a
subclass changes a size by changing ``max_bs`` and not by declaring the buffer again.  One
descriptor object may be placed in several classes (the attention backends and the drafter
share the page-table declarations of ``attn_base``): the storage is still per instance.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Tuple, Union

import torch

logger = logging.getLogger(__name__)

Shape = Union[int, Tuple[int, ...]]
ShapeFn = Callable[[Any], Shape]
SizeFn = Callable[[Any], int]

_SLOT_PREFIX = "_dm_"


def slot_name(name: str) -> str:
    return _SLOT_PREFIX + name


def descriptor_slots(*names: str) -> Tuple[str, ...]:
    """``__slots__`` entries for the descriptors a slotted class declares."""
    return tuple(slot_name(n) for n in names)


def _as_shape(shape: Shape) -> Tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    return tuple(shape)


class _SlotDescriptor:
    """Name binding and per-instance storage, shared by the descriptors below."""

    def __init__(self) -> None:
        self.name: Optional[str] = None
        self.slot: Optional[str] = None

    def __set_name__(self, owner: type, name: str) -> None:
        # The same object is declared by several classes; it must keep one attribute name,
        # or two owners would read each other's slots.
        assert self.name in (None, name), f"{self.name!r} declared again as {name!r}"  # expect: FC109
        self.name = name
        self.slot = slot_name(name)

    def _stored(self, obj: Any) -> Any:
        return getattr(obj, self.slot, None)

    def _store(self, obj: Any, value: Any) -> None:
        setattr(obj, self.slot, value)


class DeviceBuffer(_SlotDescriptor):
    """A device tensor, allocated per instance on first access from the owner's limits."""

    def __init__(self, shape: ShapeFn, dtype: torch.dtype = torch.int32, fill: Union[int, float, bool] = 0) -> None:
        super().__init__()
        self.shape = shape
        self.dtype = dtype
        self.fill = fill

    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        assert self.slot is not None, "DeviceBuffer used outside a class body"  # ok: FC109
        if self._stored(obj) is None:
            setattr(obj, self.slot, torch.full(_as_shape(self.shape(obj)), self.fill, dtype=self.dtype, device=obj.device))  # ok: FC107
        return getattr(obj, self.slot)

    def __set__(self, obj: Any, value: torch.Tensor) -> None:
        assert value.dtype == self.dtype, f"{self.name}: expected {self.dtype}, got {value.dtype}"  # expect: FC109
        self._store(obj, value)

    def grow(self, obj: Any, rows: int) -> torch.Tensor:
        """Make room for ``rows`` leading rows, keeping the current contents."""
        old = self.__get__(obj, type(obj))
        if old.shape[0] >= rows:
            return old
        setattr(obj, self.slot, torch.zeros((rows,) + tuple(old.shape[1:]), dtype=self.dtype, device=old.device))  # expect: FC107
        new = getattr(obj, self.slot)
        new[: old.shape[0]].copy_(old)
        logger.info("%s grown to %d rows", self.name, rows)
        return new


class GraphInput(DeviceBuffer):
    """An input of a captured graph: assigning copies into the captured storage."""

    def __set__(self, obj: Any, value: torch.Tensor) -> None:
        dst = self.__get__(obj, type(obj))
        rows = value.shape[0]
        if rows > dst.shape[0]:
            raise ValueError(f"{self.name}: {rows} rows do not fit the captured buffer of {dst.shape[0]}")
        dst[:rows].copy_(value, non_blocking=True)


class PinnedMirror(_SlotDescriptor):
    """A pinned host tensor, the staging twin of a DeviceBuffer (filled through a HostView)."""

    def __init__(self, shape: ShapeFn, dtype: torch.dtype = torch.int32) -> None:
        super().__init__()
        self.shape = shape
        self.dtype = dtype

    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        if self._stored(obj) is None:
            self._store(obj, torch.zeros(_as_shape(self.shape(obj)), dtype=self.dtype, device="cpu", pin_memory=True))
        return getattr(obj, self.slot)

    def grow(self, obj: Any, rows: int) -> torch.Tensor:
        old = self.__get__(obj, type(obj))
        if old.shape[0] >= rows:
            return old
        setattr(obj, self.slot, torch.zeros((rows,) + tuple(old.shape[1:]), dtype=self.dtype, pin_memory=True))  # ok: FC107
        new = getattr(obj, self.slot)
        new[: old.shape[0]].copy_(old)
        return new


class HostView:
    """A NumPy view of a pinned mirror: no copy, no device access."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.name: Optional[str] = None

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        return getattr(obj, self.source).numpy()  # ok: FC101


class HostSnapshot:
    """A host copy of a tensor attribute, for statistics and schedulers that want numbers."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        return getattr(obj, self.source).cpu()  # expect: FC101


class Workspace(_SlotDescriptor):
    """A per-instance FlashInfer float workspace, sized from the owner's limits."""

    def __init__(self, nbytes: SizeFn) -> None:
        super().__init__()
        self.nbytes = nbytes

    def _alloc(self, obj: Any) -> torch.Tensor:
        return torch.empty(self.nbytes(obj), dtype=torch.uint8, device=obj.device)  # expect: FC105

    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        ws = self._stored(obj)
        if ws is None:
            ws = self._alloc(obj)
            self._store(obj, ws)
        return ws


class ZeroedWorkspace(Workspace):
    """A workspace for kernels that keep semaphores in it (trtllm-gen graph wrappers)."""

    def _alloc(self, obj: Any) -> torch.Tensor:
        ws = torch.empty(self.nbytes(obj), dtype=torch.uint8, device=obj.device)  # ok: FC105
        ws.zero_()
        return ws


class FixedWorkspace(Workspace):
    """A workspace of a size fixed in the class body."""

    def __init__(self, nbytes: int) -> None:
        _SlotDescriptor.__init__(self)
        self.fixed_nbytes = nbytes

    def _alloc(self, obj: Any) -> torch.Tensor:
        workspace = torch.zeros(self.fixed_nbytes, dtype=torch.uint8, device=obj.device)  # expect: FC106
        return workspace


class LazyWrapper(_SlotDescriptor):
    """A FlashInfer wrapper built on first use by ``factory(owner)``."""

    def __init__(self, factory: Callable[[Any], Any]) -> None:
        super().__init__()
        self.factory = factory

    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        wrapper = self._stored(obj)
        if wrapper is None:
            wrapper = self.factory(obj)
            self._store(obj, wrapper)
        return wrapper


class WrapperAttr:
    """A read-only view of one attribute of a wrapper the owner holds (debug and warm-up)."""

    def __init__(self, holder: str, field: str) -> None:
        self.holder = holder
        self.field = field

    def __get__(self, obj: Any, objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.holder), self.field, None)  # expect: FC103
