"""Layer ``cupti``: CUPTI callbacks on the few CUDA calls that matter, filtered in C, decided in Python.

CUPTI calls back on the thread that makes a CUDA runtime or driver call, before the call runs, so every event of this
layer carries the Python stack of the line that called into CUDA, however deep in C++ the call was made. Callbacks
are enabled for these calls only (every other call, kernel launches included, costs nothing):

- **blocking calls**: ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, synchronous ``cudaMemcpy*`` and their
  driver twins (``cuStreamSynchronize``, ``cuCtxSynchronize``, ``cuMemcpyDtoH`` ...), including those inside C++
  extensions such as FlashInfer's ``plan()`` copying a device ``indptr`` to the host;
- **asynchronous copies** (``cudaMemcpyAsync``, which torch and FlashInfer use for every copy): a device-to-host
  copy, and a host-to-device copy from pageable memory, which the driver stages synchronously despite
  ``non_blocking=True``. Whether the host side is pinned is asked of the driver (``cuPointerGetAttribute``); a pinned
  address is remembered, a pageable one asked again (it becomes pinned when registered).

A runtime call and the driver call it makes share a correlation id and are reported once; so is a blocking copy,
whose copy and stream synchronize come from one Python call. Calls the layer leaves alone, because torch makes them
while holding its allocator's lock and a callback that waits for the GIL there can deadlock against a thread that
holds the GIL and frees memory: device allocations (``cudaMalloc``: ``gpu_trace`` sees each caching-allocator
allocation with its stack), ``cudaFree``, event synchronizes (``gpu_trace`` sees ``Event.synchronize()``) and pinned
host allocations. Misses besides: copies a CUDA graph runs at replay (a pinned copy captured into a graph is seen at
capture, by ``dispatch``), 2D/3D and peer async copies, asynchronous copies made through the driver API directly
(``cuMemcpyHtoDAsync``: the runtime makes every ``cudaMemcpyAsync`` through it, so watching it would double the
cost of every copy), other processes, and everything while another CUPTI client (``torch.profiler``, Nsight) holds
the process's one subscriber slot (and the slot stays this layer's while a checker runs). Needs a GPU and
``cupti-python`` >= 13.2, a CUDA 13 package (``pip install 'flashcheck[gpu]'``; seen working on an H100 with driver
580 and CUDA 13.0's libcupti); where it is missing or does not load, the layer is skipped with the reason.

Cost: nothing for a call it does not watch. CUPTI calls a small C function (`flashcheck.runtime.hooks.cupti_native`,
compiled on first use) that answers the exit of every call, the driver call inside a runtime call already seen, a
host-to-device copy from pinned memory (the one copy an engine's replay path makes every step) and a copy with no
host side, without entering Python; the other watched calls come here, to `CuptiHook`, with the stack intact. Where
the filter cannot be built (no C compiler) or with ``FLASHCHECK_CUPTI_FILTER=0``, ``cupti-python`` calls Python as
every watched call enters and returns (`CuptiHook.backend_note` says which runs, and the run's "detection layers"
fact). Figures: ``benchmarks/runtime_overhead.py`` (the ``all`` and ``all-python`` rows of reports/gpu-evidence.md).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, Literal, Protocol

from flashcheck.findings import Frame
from flashcheck.runtime.hooks.base import EventSink, Hook
from flashcheck.runtime.monitor import Event, Memory
from flashcheck.runtime.stacks import capture_stack, stack_from

__all__ = ["COPY_APIS", "SYNC_APIS", "Backend", "CuptiBindings", "CuptiHook", "api_base_name", "call_kind"]

Call = Literal["sync", "copy"]
Direction = Literal["HtoD", "DtoH", "other"]

# Blocking calls (names without version suffixes such as _v2, _v3020, _ptsz).
SYNC_APIS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpy3D",
        "cudaMemcpyPeer",
        "cudaMemcpyFromSymbol",
        "cudaMemcpyToSymbol",
        "cudaMemcpyFromArray",
        "cudaMemcpyToArray",
        "cudaMemcpy2DFromArray",
        "cudaMemcpy2DToArray",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuMemcpy",
        "cuMemcpyDtoH",
        "cuMemcpyHtoD",
        "cuMemcpyAtoH",
        "cuMemcpyHtoA",
        "cuMemcpy2D",
        "cuMemcpy2DUnaligned",
        "cuMemcpy3D",
        "cuMemcpyPeer",
    }
)
# Asynchronous copies: cudaMemcpyAsync(dst, src, count, kind, stream). The runtime makes each copy through the
# driver's cuMemcpyHtoDAsync/cuMemcpyDtoHAsync: watching those as well would double the callbacks of every copy an
# engine makes, for the rare extension that calls the driver's copies directly.
COPY_APIS = frozenset({"cudaMemcpyAsync"})
_SUFFIX = re.compile(r"(?:_v\d+|_ptsz|_ptds)+$")
_PINNED_CACHE_SIZE = 4096


def api_base_name(name: str) -> str:
    """``cuMemcpyDtoH_v2`` -> ``cuMemcpyDtoH``; ``cudaStreamSynchronize_ptsz_v7000`` -> ``cudaStreamSynchronize``."""
    return _SUFFIX.sub("", name)


def call_kind(name: str) -> Call | None:
    """What a CUDA call (its base name) is to this layer, or None for the calls it leaves alone."""
    if name in SYNC_APIS:
        return "sync"
    if name in COPY_APIS:
        return "copy"
    return None


class Backend(Protocol):
    """What the hook needs of CUPTI; `CuptiBindings` is the real one, tests pass fakes."""

    @property
    def callback_code(self) -> CodeType:
        """The code of the function that calls `on_call`: the stack of an event starts at its caller."""

    def open(self) -> str | None:
        """Claim CUPTI for this process; the reason it cannot, or None."""

    def start(self, on_call: Callable[[str, Call, int, int], None]) -> None:
        """Call ``on_call(base name, what it is, correlation id, parameter struct address)`` on the thread of every
        call `call_kind` knows, before it runs."""

    def copy_args(self, name: str, params: int) -> tuple[Direction, int, int]:
        """Direction, host pointer and byte count of an asynchronous copy call."""

    def host_memory(self, ptr: int) -> Memory:
        """Whether host address `ptr` is pinned (page-locked, known to the driver), pageable, or unknown."""

    def close(self) -> None:
        """Stop the callbacks and release CUPTI."""


class CuptiHook(Hook):
    """Reports blocking CUDA calls, device-to-host copies and host-to-device copies from pageable memory made in hot
    regions, each with the Python stack that made it.

    Args:
        backend: the CUPTI binding (default: `CuptiBindings` over ``cupti-python``); tests pass fakes.
        available: whether a CUDA device is there (default: ask torch).
    """

    layer = "cupti"
    reports = (
        Event("sync", "cupti"),
        Event("d2h_copy", "cupti", memory="pageable"),
        Event("d2h_copy", "cupti", memory="pinned"),
        Event("h2d_copy", "cupti", memory="pageable"),
    )

    def __init__(self, *, backend: Backend | None = None, available: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self._backend = backend
        self._available = available
        self._opened: Backend | None = None
        self._last: dict[int, int] = {}  # thread -> correlation id of the last call handled
        self._last_copy: dict[int, tuple[CodeType, int]] = {}  # thread -> where its last reported copy was made
        self._pinned: set[int] = set()  # host addresses the driver said are pinned
        self.backend_note: str | None = None  # how the default backend calls back: "C filter" or why not

    def unavailable_reason(self) -> str | None:
        if self._opened is not None:  # asked twice: CUPTI is already this layer's
            return None
        if self._available is not None:
            if not self._available():
                return "no CUDA device"
        else:
            import torch

            if not torch.cuda.is_available():
                return "no CUDA device (CUPTI needs one)"
        backend, reason = self._open_backend()
        if reason is None:
            self._opened = backend
        return reason

    def _install(self, sink: EventSink) -> None:
        backend = self._opened
        if backend is None:  # installed without asking first (tests, or a caller that knows)
            backend, reason = self._open_backend()
            if reason is not None:
                raise RuntimeError(f"CUPTI layer: {reason}")
            self._opened = backend
        self._last, self._last_copy, self._pinned = {}, {}, set()
        try:
            backend.start(self._on_call)
        except BaseException:
            self._opened = None
            backend.close()
            raise

    def _open_backend(self) -> tuple[Backend, str | None]:
        """The given backend, or the default one (`_open_default`), opened: (it, why it cannot run or None)."""
        if self._backend is not None:
            return self._backend, self._backend.open()
        backend, reason, self.backend_note = _open_default()
        return backend, reason

    def _uninstall(self) -> None:
        backend, self._opened = self._opened, None
        if backend is not None:
            backend.close()

    def _on_call(self, name: str, what: Call, correlation: int, params: int) -> None:
        """One CUDA call, on the thread that makes it, before it runs (an engine's replay path makes a few per step:
        the common case, a copy from pinned memory, costs a few dictionary lookups and a read of its arguments)."""
        try:
            thread = threading.get_ident()
            last = self._last
            if correlation and last.get(thread) == correlation:
                return  # the driver call inside a runtime call already seen
            last[thread] = correlation
            sink, backend = self._sink, self._opened
            if sink is None or backend is None or not sink.watching(thread):
                return
            ev = self._event(backend, name, what, params, thread)
            if ev is not None:
                self._emit(ev)
        except Exception as exc:  # CUPTI would only print it
            self._error(exc)

    @staticmethod
    def _caller(backend: Backend) -> FrameType | None:
        """The frame that made the CUDA call: the one above the backend's callback, however many frames lie between
        it and here (None when the callback is not on the stack)."""
        entry = backend.callback_code
        f: FrameType | None = sys._getframe(2)
        while f is not None and f.f_code is not entry:
            f = f.f_back
        return f.f_back if f is not None else None

    def _event(self, backend: Backend, name: str, what: Call, params: int, thread: int) -> Event | None:
        if what == "sync":
            caller = self._caller(backend)
            if caller is not None and self._last_copy.pop(thread, None) == (caller.f_code, caller.f_lasti):
                return None  # the synchronize of a blocking copy reported a moment ago, from the same Python call
            return Event("sync", "cupti", self._stack(caller), name, thread=thread)
        direction, host, nbytes = backend.copy_args(name, params)
        if direction == "other":
            return None
        pinned = self._pinned
        if host in pinned:
            memory: Memory = "pinned"
        else:
            memory = backend.host_memory(host)
            if memory == "pinned":  # remembered; a pageable address is asked again (it may be registered later)
                if len(pinned) >= _PINNED_CACHE_SIZE:
                    pinned.clear()
                pinned.add(host)
        if direction == "HtoD" and memory != "pageable":
            return None  # a copy from pinned memory runs asynchronously: what a replay path should do
        caller = self._caller(backend)  # only now: the common case above never walks the stack
        if caller is not None:
            self._last_copy[thread] = (caller.f_code, caller.f_lasti)
        side = memory.capitalize() if memory != "unknown" else "Host"
        detail = f"Memcpy HtoD ({side} -> Device)" if direction == "HtoD" else f"Memcpy DtoH (Device -> {side})"
        return Event(
            "h2d_copy" if direction == "HtoD" else "d2h_copy",
            "cupti",
            self._stack(caller),
            f"{detail} by {name}",
            memory=memory,
            nbytes=nbytes,
            thread=thread,
        )

    @staticmethod
    def _stack(caller: FrameType | None) -> tuple[Frame, ...]:
        return stack_from(caller) if caller is not None else capture_stack(4)


class FilterUnavailable(Exception):
    """The C filter cannot be loaded here (its reason is the message); the Python callbacks still can."""


def _open_default() -> tuple[Backend, str | None, str]:
    """The C filter (`flashcheck.runtime.hooks.cupti_native`) where it builds and opens, else ``cupti-python``'s
    Python callbacks: (the backend, why it cannot run or None, how it calls back)."""
    backend = CuptiBindings()
    setting = os.environ.get("FLASHCHECK_CUPTI_FILTER", "1").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return backend, backend.open(), f"Python callbacks: FLASHCHECK_CUPTI_FILTER={setting}"
    loadable = backend.loadable()  # cupti-python there and the layer free, before anything is compiled
    if isinstance(loadable, str):
        return backend, loadable, "Python callbacks"
    try:
        from flashcheck.runtime.hooks.cupti_native import CuptiNative, build_filter

        built = build_filter()
        if not isinstance(built, str):
            native = CuptiNative(built)
            why = native.open()
            if why is None:
                return native, None, "C filter"
            built = why
    except Exception as exc:  # the filter is an optimisation: any failure of it leaves the Python callbacks
        built = f"the C filter failed: {type(exc).__name__}: {exc}"
    return backend, backend.open(), f"Python callbacks: {built}"


# ------------------------------------------------------------------------------------------- cupti-python binding
_CLAIMED: list[CuptiBindings] = []  # the binding that holds this process's CUPTI subscriber
_CALLBACK_API = ("subscribe", "unsubscribe", "enable_callback", "get_callback_name", "CallbackDomain")
_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_MEMORYTYPE_HOST, _CU_MEMORYTYPE_DEVICE = 1, 2
_CUDA_ERROR_INVALID_VALUE = 1  # what cuPointerGetAttribute answers for memory the driver does not know: pageable
_CUDA_MEMCPY_KINDS: dict[int, Direction] = {1: "HtoD", 2: "DtoH"}  # cudaMemcpyKind
_CUDA_MEMCPY_DEFAULT = 4  # the direction follows from the pointers (unified addressing)


class _MemcpyAsyncParams(ctypes.Structure):
    """cudaMemcpyAsync's parameter struct as CUPTI passes it."""

    _fields_ = (
        ("dst", ctypes.c_void_p),
        ("src", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("kind", ctypes.c_int),
        ("stream", ctypes.c_void_p),
    )


class CuptiBindings:
    """`Backend` over NVIDIA's ``cupti-python`` (``from cupti import cupti``): one subscriber, with callbacks
    enabled on the calls `call_kind` knows, and the driver (``libcuda``) asked which host addresses are pinned."""

    def __init__(self) -> None:
        self._cupti: Any = None
        self._subscriber: int | None = None
        self._calls: dict[tuple[int, int], tuple[str, Call]] = {}
        self._on_call: Callable[[str, Call, int, int], None] | None = None
        self._libcuda: Any = None

    @property
    def callback_code(self) -> CodeType:
        return CuptiBindings._callback.__code__

    def open(self) -> str | None:
        cupti = self.loadable()
        if isinstance(cupti, str):
            return cupti
        try:
            self._subscriber = self._subscribe(cupti)
        except FilterUnavailable as exc:
            return str(exc)
        except Exception as exc:  # MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: torch.profiler or Nsight holds CUPTI
            return f"CUPTI is held by another client in this process (torch.profiler, Nsight): {exc}"
        self._cupti = cupti
        _CLAIMED.append(self)
        return None

    def loadable(self) -> Any:
        """``cupti-python``'s module, or why this binding cannot subscribe (without subscribing)."""
        if _CLAIMED and _CLAIMED[0] is not self:
            return "another checker's CUPTI layer is active in this process (CUPTI has one subscriber per process)"
        try:
            from cupti import cupti
        except ImportError:
            return "cupti-python is not installed (pip install 'flashcheck[gpu]' or pip install cupti-python)"
        except Exception as exc:  # its libcupti does not load here
            return f"cupti-python does not load here: {exc.__class__.__name__}: {exc}"
        missing = [n for n in _CALLBACK_API if not hasattr(cupti, n)]
        if missing:
            return f"this cupti-python has no callback API ({', '.join(missing)} missing): install cupti-python>=13.2"
        return cupti

    def start(self, on_call: Callable[[str, Call, int, int], None]) -> None:
        cupti = self._cupti
        self._calls = {}
        self._begin()
        for domain in (cupti.CallbackDomain.RUNTIME_API, cupti.CallbackDomain.DRIVER_API):
            for cbid in range(1, 2048):
                try:
                    name = api_base_name(str(cupti.get_callback_name(domain, cbid)))
                except Exception:  # not an API id in this CUDA version
                    continue
                what = call_kind(name)
                if what is not None:
                    self._calls[(int(domain), cbid)] = (name, what)
                    self._enable(cupti, domain, cbid, what)
        self._on_call = on_call

    # What `CuptiNative` does differently: who CUPTI calls, and how a call is enabled.
    def _subscribe(self, cupti: Any) -> int:
        return int(cupti.subscribe(self._callback, None))

    def _begin(self) -> None:
        return None

    def _enable(self, cupti: Any, domain: Any, cbid: int, what: Call) -> None:
        cupti.enable_callback(1, self._subscriber, domain, cbid)

    def _unsubscribe(self, cupti: Any) -> None:
        cupti.unsubscribe(self._subscriber)

    def _callback(self, userdata: Any, domain: Any, cbid: Any, cbdata: Any) -> None:
        on_call = self._on_call
        if on_call is None or cbdata.callback_site:  # 0: API_ENTER; 1: API_EXIT
            return
        hit = self._calls.get((domain, cbid))  # an IntEnum domain hashes and compares as its int
        if hit is not None:
            on_call(hit[0], hit[1], cbdata.correlation_id, cbdata.function_params)

    def copy_args(self, name: str, params: int) -> tuple[Direction, int, int]:
        p = _MemcpyAsyncParams.from_address(params)
        dst, src, count = p.dst or 0, p.src or 0, int(p.count)
        if p.kind == _CUDA_MEMCPY_DEFAULT:  # unified addressing: ask where each side lives
            dst_kind, src_kind = self._memory_type(dst), self._memory_type(src)
            if dst_kind == _CU_MEMORYTYPE_DEVICE and src_kind != _CU_MEMORYTYPE_DEVICE:
                return "HtoD", src, count
            if src_kind == _CU_MEMORYTYPE_DEVICE and dst_kind != _CU_MEMORYTYPE_DEVICE:
                return "DtoH", dst, count
            return "other", 0, count
        direction = _CUDA_MEMCPY_KINDS.get(p.kind, "other")
        return direction, (src if direction == "HtoD" else dst), count

    def _cuda(self) -> Any:
        lib = self._libcuda
        if lib is None:
            lib = self._libcuda = ctypes.CDLL("libcuda.so.1")
        return lib

    def _memory_type(self, ptr: int) -> int | None:
        """CU_MEMORYTYPE_* of an address; 0 for memory the driver does not know (pageable); None when it cannot
        say (an error other than not knowing the address)."""
        lib = self._cuda()
        kind = ctypes.c_uint(0)
        err = lib.cuPointerGetAttribute(ctypes.byref(kind), _CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ctypes.c_void_p(ptr))
        if err == _CUDA_ERROR_INVALID_VALUE:
            return 0
        return int(kind.value) if err == 0 else None

    def host_memory(self, ptr: int) -> Memory:
        kind = self._memory_type(ptr)
        return "pageable" if kind == 0 else "pinned" if kind == _CU_MEMORYTYPE_HOST else "unknown"

    def close(self) -> None:
        cupti = self._cupti
        self._on_call = None
        if cupti is None:
            return
        try:
            if self._subscriber is not None:
                self._unsubscribe(cupti)
        finally:
            self._subscriber, self._cupti, self._calls = None, None, {}
            if self in _CLAIMED:
                _CLAIMED.remove(self)
