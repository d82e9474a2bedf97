"""Layer ``gpu_trace``: torch's GPU trace callbacks (the hook layer under CUDA Sanitizer).

Catches ``torch.cuda.synchronize()`` (device sync), ``Event.synchronize()``, every stream sync torch makes
(``.item()``, ``.cpu()``, blocking copies) and every caching-allocator allocation, on the calling thread and so with
its Python stack. Misses (measured on an H100): ``non_blocking`` pageable copies, syncs and ``cudaMalloc``
inside C++ extensions. Cost: none measurable. ``torch._C._activate_gpu_trace()`` cannot be undone, so it is called
once per process; our callbacks are added to torch's registries on install, removed on uninstall, and return at once
unless a hot region is open on the calling thread (the hook asks the checker when a callback fires, so opening a
region costs it nothing).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from flashcheck.runtime.hooks.base import EventSink, Hook
from flashcheck.runtime.monitor import Event, EventKind
from flashcheck.runtime.stacks import capture_stack

__all__ = ["GpuTraceHook"]

_ACTIVATED: list[bool] = []  # non-empty once activated in this process (it cannot be undone)


def _activate() -> None:
    if not _ACTIVATED:
        import torch

        torch._C._activate_gpu_trace()
        _ACTIVATED.append(True)


def _torch_registries() -> dict[str, Any]:
    import torch.cuda._gpu_trace as gt

    return {
        "device_sync": gt.DeviceSynchronizationCallbacks,
        "stream_sync": gt.StreamSynchronizationCallbacks,
        "event_sync": gt.EventSynchronizationCallbacks,
        "alloc": gt.MemoryAllocationCallbacks,
    }


class GpuTraceHook(Hook):
    """Registers device/stream/event-sync and allocation callbacks with ``torch.cuda._gpu_trace``.

    Args:
        registries: the callback registries to use (objects with a ``callback_list``), keyed by ``device_sync``,
            ``stream_sync``, ``event_sync``, ``alloc``; tests pass fakes, the default is torch's.
        activate: called once before registering (default: ``torch._C._activate_gpu_trace``).
    """

    layer = "gpu_trace"
    reports = (Event("sync", "gpu_trace"), Event("alloc", "gpu_trace"))

    def __init__(
        self,
        *,
        registries: dict[str, Any] | None = None,
        activate: Callable[[], None] | None = None,
        available: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__()
        self._registries = registries
        self._activate = activate or _activate
        self._available = available
        self._callbacks: dict[str, Callable[..., None]] = {}

    def unavailable_reason(self) -> str | None:
        if self._available is not None:
            return None if self._available() else "no CUDA device"
        import torch

        return None if torch.cuda.is_available() else "no CUDA device (gpu trace callbacks never fire)"

    def _install(self, sink: EventSink) -> None:
        regs = self._registries if self._registries is not None else _torch_registries()
        self._registries = regs
        self._activate()
        self._callbacks = {
            "device_sync": self._on_device_sync,
            "stream_sync": self._on_stream_sync,
            "event_sync": self._on_event_sync,
            "alloc": self._on_alloc,
        }
        for key, cb in self._callbacks.items():
            regs[key].callback_list.append(cb)

    def _uninstall(self) -> None:
        regs = self._registries or {}
        for key, cb in self._callbacks.items():
            lst = regs[key].callback_list
            # Remove exactly our entry (by identity), leaving other tools' callbacks in place and in order.
            for i in range(len(lst) - 1, -1, -1):
                if lst[i] is cb:
                    del lst[i]
                    break
        self._callbacks = {}

    def _report(self, kind: EventKind, detail: str) -> None:
        try:
            sink = self._sink
            thread = threading.get_ident()
            if sink is None or not sink.watching(thread):
                return
            self._emit(Event(kind, "gpu_trace", capture_stack(3), detail, thread=thread))
        except Exception as exc:  # torch's CallbackRegistry would only log it
            self._error(exc)

    def _on_device_sync(self) -> None:
        self._report("sync", "device synchronize (torch.cuda.synchronize)")

    def _on_stream_sync(self, stream: int) -> None:
        self._report("sync", "stream synchronize")

    def _on_event_sync(self, event: int) -> None:
        self._report("sync", "event synchronize")

    def _on_alloc(self, ptr: int) -> None:
        self._report("alloc", "caching-allocator allocation")
