"""Layer ``cupti``: CUPTI through NVIDIA's ``cupti-python`` bindings, with nothing in Python on a clean step.

Two CUPTI mechanisms, each for what it does best:

- **Callbacks** on the blocking CUDA calls only (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``, synchronous ``cudaMemcpy*`` and their driver twins ``cuStreamSynchronize``,
  ``cuCtxSynchronize``, ``cuMemcpyDtoH`` ...). CUPTI calls them on the thread that blocks, before it blocks, so the
  event carries the Python stack: a sync made inside a C++ extension (FlashInfer's ``plan()`` copying a device
  ``indptr`` to the host) is reported at the user's line that called into it. A clean replay path makes no such
  call, so no callback runs.
- **Activity records**, written by CUPTI in C into buffers and read when the checker drains: every memcpy with its
  direction and host memory kind (``Memcpy HtoD (Pageable -> Device)``, ``Memcpy DtoH (Device -> Pinned)``), the
  graph it ran in, every device allocation made through the CUDA APIs (``cudaMalloc`` of the caching allocator
  growing its pool, or of a C++ extension that bypasses it), and the host-side API call that launched each (only
  the copy, graph-launch and allocation APIs are recorded). Each is attributed to the innermost hot region open on
  the launching thread at the launch's CUPTI timestamp; regions and ``checker_read`` blocks take two CUPTI
  timestamps each. These events have no Python stack: they join a finding of the same check and region that
  another layer saw with one, or else point where the region was opened.

Misses: copies and syncs of other processes; calls made while another CUPTI client (``torch.profiler``, Nsight) holds
the one subscriber slot of the process: the layer is then skipped with that reason. Needs a GPU and ``cupti-python``
(``pip install 'flashcheck[gpu]'``). Cost (H100, a replay loop of 27 µs per step): not measurable beside the loop;
a drain reads about 250,000 records per second.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flashcheck.runtime.hooks.base import EventSink, Hook
from flashcheck.runtime.monitor import Event, Memory, RegionRecord
from flashcheck.runtime.stacks import capture_stack

__all__ = [
    "ALLOC_APIS",
    "SYNC_APIS",
    "AllocRecord",
    "ApiRecord",
    "Backend",
    "CopyRecord",
    "CuptiHook",
    "Records",
    "Window",
    "api_base_name",
    "attribute",
]

# Blocking calls, reported at the call with its stack (names without version suffixes such as _v2, _v3020, _ptsz).
SYNC_APIS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
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
        "cuEventSynchronize",
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
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
ALLOC_APIS = frozenset(
    {
        "cudaMalloc",
        "cudaMallocPitch",
        "cudaMalloc3D",
        "cudaMallocAsync",
        "cudaMallocFromPoolAsync",
        "cudaMallocManaged",
        "cuMemAlloc",
        "cuMemAllocPitch",
        "cuMemAllocAsync",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocManaged",
        "cuMemCreate",
    }
)
_SUFFIX = re.compile(r"(?:_v\d+|_ptsz|_ptds)+$")
_THREAD_MASK = 0xFFFFFFFF  # CUPTI's activity records carry the low 32 bits of pthread_self (threading.get_ident)


def api_base_name(name: str) -> str:
    """``cuMemcpyDtoH_v2`` -> ``cuMemcpyDtoH``; ``cudaStreamSynchronize_ptsz_v7000`` -> ``cudaStreamSynchronize``."""
    return _SUFFIX.sub("", name)


def recorded_api(name: str) -> bool:
    """Whether the activity records of API `name` (a base name) are kept: copies, graph launches, allocations."""
    return name.startswith(("cudaMemcpy", "cuMemcpy")) or name in GRAPH_LAUNCH_APIS or name in ALLOC_APIS


@dataclass(frozen=True, slots=True)
class ApiRecord:
    """A host-side CUDA call: its base name, CUPTI timestamps, thread (low 32 bits) and correlation id."""

    name: str
    start: int
    end: int
    thread: int
    correlation: int


@dataclass(frozen=True, slots=True)
class CopyRecord:
    """A memcpy CUPTI saw execute: ``kind`` is ``HtoD``, ``DtoH`` or another CUPTI copy kind; ``src``/``dst`` are
    ``pageable``, ``pinned``, ``device`` or ``other``; ``graph`` says a CUDA graph ran it."""

    kind: str
    src: str
    dst: str
    correlation: int
    graph: bool
    nbytes: int


@dataclass(frozen=True, slots=True)
class AllocRecord:
    """A device memory allocation made through the CUDA APIs."""

    nbytes: int
    correlation: int


@dataclass(frozen=True, slots=True)
class Window:
    """A region (``region_id``) or a ``checker_read`` block (``region_id`` None) on a thread, in CUPTI time."""

    region_id: int | None
    thread: int
    start: int
    end: int


@dataclass
class Records:
    """What one flush of the activity buffers brought."""

    apis: list[ApiRecord]
    copies: list[CopyRecord]
    allocs: list[AllocRecord]


class _Index:
    """Windows of one thread, sorted by start: the innermost window containing a time (windows nest or are apart)."""

    def __init__(self, windows: Iterable[Window]) -> None:
        self._w = sorted(windows, key=lambda w: (w.start, -w.end))
        self._starts = [w.start for w in self._w]

    def innermost(self, t: int) -> Window | None:
        i = bisect.bisect_right(self._starts, t) - 1
        while i >= 0:
            w = self._w[i]
            if w.end >= t:
                return w
            i -= 1
        return None


def attribute(regions: Sequence[Window], reads: Sequence[Window], records: Records) -> list[Event]:
    """Copies and allocations attributed to the innermost region open on the launching thread at the launch; those
    launched inside a ``checker_read`` block, outside every region, or by a call CUPTI did not record are dropped."""
    by_thread: dict[int, list[Window]] = {}
    for w in regions:
        by_thread.setdefault(w.thread, []).append(w)
    region_index = {t: _Index(ws) for t, ws in by_thread.items()}
    read_by_thread: dict[int, list[Window]] = {}
    for w in reads:
        read_by_thread.setdefault(w.thread, []).append(w)
    read_index = {t: _Index(ws) for t, ws in read_by_thread.items()}
    launches = {a.correlation: a for a in records.apis if a.correlation}

    def region_of(corr: int) -> tuple[ApiRecord, int] | None:
        api = launches.get(corr)
        if api is None:
            return None
        reads_here = read_index.get(api.thread)
        if reads_here is not None and reads_here.innermost(api.start) is not None:
            return None
        index = region_index.get(api.thread)
        w = index.innermost(api.start) if index is not None else None
        if w is None or w.region_id is None:
            return None
        return api, w.region_id

    out: list[tuple[int, Event]] = []  # by the time of the call that made each: the order they happened in
    for c in records.copies:
        if c.kind not in ("HtoD", "DtoH"):
            continue
        hit = region_of(c.correlation)
        if hit is None:
            continue
        api, rid = hit
        host = c.dst if c.kind == "DtoH" else c.src
        memory: Memory = "pinned" if host == "pinned" else "pageable" if host == "pageable" else "unknown"
        src, dst = ("Device", host.capitalize()) if c.kind == "DtoH" else (host.capitalize(), "Device")
        out.append(
            (
                api.start,
                Event(
                    "d2h_copy" if c.kind == "DtoH" else "h2d_copy",
                    "cupti",
                    (),
                    f"Memcpy {c.kind} ({src} -> {dst}) by {api.name}",
                    memory=memory,
                    in_graph=c.graph or api.name in GRAPH_LAUNCH_APIS,
                    capturing=False,  # a copy CUPTI saw execute was not being captured (captured copies run at replay)
                    nbytes=c.nbytes,
                    region_id=rid,
                ),
            )
        )
    for a in records.allocs:
        hit = region_of(a.correlation)
        if hit is None:
            continue
        api, rid = hit
        detail = f"{api.name} of {a.nbytes:,} bytes"
        out.append((api.start, Event("alloc", "cupti", (), detail, nbytes=a.nbytes, region_id=rid)))
    out.sort(key=lambda x: x[0])
    return [ev for _, ev in out]


class Backend(Protocol):
    """What the hook needs of CUPTI; `CuptiBindings` is the real one, tests pass fakes."""

    def open(self) -> str | None:
        """Claim CUPTI for this process; the reason it cannot, or None."""

    def start(self, on_sync: Callable[[str, int], None]) -> None:
        """Call ``on_sync(api base name, correlation id)`` on every blocking call, and record activities."""

    def timestamp(self) -> int: ...

    def flush(self) -> Records:
        """The activity records written since the last flush."""

    def close(self) -> Records:
        """Stop recording, release CUPTI, and return the records still buffered."""


class CuptiHook(Hook):
    """Reports blocking CUDA calls as they happen (with stacks) and copies and allocations at each drain.

    Args:
        backend: the CUPTI binding (default: `CuptiBindings` over ``cupti-python``); tests pass fakes.
        available: whether a CUDA device is there (default: ask torch).
    """

    layer = "cupti"

    def __init__(self, *, backend: Backend | None = None, available: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self._backend = backend
        self._available = available
        self._opened: Backend | None = None
        self._ts: Callable[[], int] = int
        self._open: dict[int, tuple[int, int]] = {}  # region id -> (thread, start)
        self._read_open: dict[int, list[int]] = {}  # thread -> starts of the open reads
        self._regions: list[Window] = []
        self._reads: list[Window] = []
        self._last_sync: dict[int, int] = {}  # thread -> correlation id of the last blocking call reported
        self._pending: list[Event] = []

    def unavailable_reason(self) -> str | None:
        if self._available is not None:
            if not self._available():
                return "no CUDA device"
        else:
            import torch

            if not torch.cuda.is_available():
                return "no CUDA device (CUPTI needs one)"
        backend = self._backend if self._backend is not None else CuptiBindings()
        reason = backend.open()
        if reason is None:
            self._opened = backend
        return reason

    def _install(self, sink: EventSink) -> None:
        backend = self._opened
        if backend is None:  # installed without asking first (tests, or a caller that knows)
            backend = self._backend if self._backend is not None else CuptiBindings()
            reason = backend.open()
            if reason is not None:
                raise RuntimeError(f"CUPTI layer: {reason}")
            self._opened = backend
        self._pending, self._regions, self._reads, self._open, self._read_open = [], [], [], {}, {}
        self._last_sync = {}
        self._ts = backend.timestamp
        try:
            backend.start(self._on_sync)
        except BaseException:
            self._opened = None
            backend.close()
            raise

    def _uninstall(self) -> None:
        backend, self._opened = self._opened, None
        if backend is None:
            return
        self._pending.extend(self._attribute(backend.close()))
        self._open, self._read_open = {}, {}

    def _on_sync(self, name: str, correlation: int) -> None:
        """A blocking CUDA call on the calling thread (a runtime call and the driver call inside it share one
        correlation id: reported once)."""
        try:
            sink = self._sink
            if sink is None or not sink.hot_now() or sink.reading():
                return
            thread = threading.get_ident()
            if correlation and self._last_sync.get(thread) == correlation:
                return
            self._last_sync[thread] = correlation
            self._emit(Event("sync", "cupti", capture_stack(3), name, thread=thread))
        except Exception as exc:  # CUPTI would only print it
            self._error(exc)

    def region_enter(self, rec: RegionRecord, hot: bool) -> None:
        if hot:
            self._open[rec.id] = (rec.thread & _THREAD_MASK, self._ts())

    def region_exit(self, rec: RegionRecord, hot: bool) -> None:
        opened = self._open.pop(rec.id, None)
        if opened is not None:
            self._regions.append(Window(rec.id, opened[0], opened[1], self._ts()))

    def read_begin(self) -> None:
        if self._opened is not None:
            self._read_open.setdefault(threading.get_ident(), []).append(self._ts())

    def read_end(self) -> None:
        thread = threading.get_ident()
        starts = self._read_open.get(thread)
        if starts:
            self._reads.append(Window(None, thread & _THREAD_MASK, starts.pop(), self._ts()))

    def collect(self) -> list[Event]:
        """The copies and allocations recorded since the last collect (only call with no region or read open)."""
        out, self._pending = self._pending, []
        if self._opened is not None and not self._open and not any(self._read_open.values()):
            out.extend(self._attribute(self._opened.flush()))
        return out

    def _attribute(self, records: Records) -> list[Event]:
        regions, reads = self._regions, self._reads
        self._regions, self._reads = [], []
        return attribute(regions, reads, records)


# ------------------------------------------------------------------------------------------- cupti-python binding
_MEMORY_KINDS = {1: "pageable", 2: "pinned", 3: "device"}  # CUpti_ActivityMemoryKind
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP"}  # CUpti_ActivityMemcpyKind
_CLAIMED: list[CuptiBindings] = []  # the binding that holds this process's CUPTI subscriber


class CuptiBindings:
    """`Backend` over NVIDIA's ``cupti-python`` (``from cupti import cupti``): one subscriber with callbacks on the
    blocking APIs, activity records of memcpys, device allocations and the API calls that launch them."""

    _BUFFER_BYTES = 8 << 20

    def __init__(self) -> None:
        self._cupti: Any = None
        self._subscriber: int | None = None
        self._names: dict[tuple[int, int], str] = {}
        self._kinds: tuple[int, ...] = ()
        self._buf: list[Records] = []
        self._lock = threading.Lock()
        self._on_sync: Callable[[str, int], None] | None = None

    def open(self) -> str | None:
        if _CLAIMED and _CLAIMED[0] is not self:
            return "another checker's CUPTI layer is active in this process (CUPTI has one subscriber per process)"
        try:
            from cupti import cupti
        except ImportError:
            return "cupti-python is not installed (pip install 'flashcheck[gpu]' or pip install cupti-python)"
        try:
            self._subscriber = int(cupti.subscribe(self._callback, None))
        except Exception as exc:  # MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: torch.profiler or Nsight holds CUPTI
            return f"CUPTI is held by another client in this process (torch.profiler, Nsight): {exc}"
        self._cupti = cupti
        _CLAIMED.append(self)
        return None

    def _api_names(self) -> dict[tuple[int, int], str]:
        cupti = self._cupti
        names: dict[tuple[int, int], str] = {}
        for domain in (cupti.CallbackDomain.RUNTIME_API, cupti.CallbackDomain.DRIVER_API):
            for cbid in range(1, 2048):
                try:
                    names[(int(domain), cbid)] = api_base_name(str(cupti.get_callback_name(domain, cbid)))
                except Exception:  # not an API id in this CUDA version
                    continue
        return names

    def start(self, on_sync: Callable[[str, int], None]) -> None:
        cupti = self._cupti
        self._on_sync = on_sync
        self._names = self._api_names()
        runtime, driver = int(cupti.CallbackDomain.RUNTIME_API), int(cupti.CallbackDomain.DRIVER_API)
        for (domain, cbid), name in self._names.items():
            if name in SYNC_APIS:
                cupti.enable_callback(1, self._subscriber, domain, cbid)
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        kinds = cupti.ActivityKind
        self._kinds = (int(kinds.MEMCPY), int(kinds.MEMORY2), int(kinds.RUNTIME), int(kinds.DRIVER))
        for k in self._kinds:
            cupti.activity_enable(k)
        self._select_api_records(runtime, driver, all_of_them=False)

    def _select_api_records(self, runtime: int, driver: int, *, all_of_them: bool) -> None:
        """Record only the copy, graph-launch and allocation calls (or, when done, every call again for the next
        CUPTI client)."""
        cupti = self._cupti
        for (domain, cbid), name in self._names.items():
            on = 1 if all_of_them or recorded_api(name) else 0
            try:
                if domain == runtime:
                    cupti.activity_enable_runtime_api(cbid, on)
                elif domain == driver:
                    cupti.activity_enable_driver_api(cbid, on)
            except Exception:  # an id this CUPTI cannot select: it keeps its default
                continue

    def timestamp(self) -> int:
        return int(self._cupti.get_timestamp())

    def _callback(self, userdata: Any, domain: Any, cbid: Any, cbdata: Any) -> None:
        on_sync = self._on_sync
        if on_sync is None or cbdata.callback_site != 0:  # 0: API_ENTER
            return
        on_sync(self._names.get((int(domain), int(cbid)), str(cbdata.function_name)), int(cbdata.correlation_id))

    def _buffer_requested(self) -> tuple[int, int]:
        return self._BUFFER_BYTES, 0

    def _buffer_completed(self, activities: Iterable[Any]) -> None:
        """Runs on CUPTI's thread or in `flush`: the records, converted at once (the buffer is reused)."""
        kinds = self._cupti.ActivityKind
        memcpy, memory, runtime, driver = int(kinds.MEMCPY), int(kinds.MEMORY2), int(kinds.RUNTIME), int(kinds.DRIVER)
        rt_domain, drv_domain = int(self._cupti.CallbackDomain.RUNTIME_API), int(self._cupti.CallbackDomain.DRIVER_API)
        names = self._names
        recs = Records([], [], [])
        for a in activities:
            k = int(a.kind)
            if k == memcpy:
                recs.copies.append(
                    CopyRecord(
                        _COPY_KINDS.get(int(a.copy_kind), "other"),
                        _MEMORY_KINDS.get(int(a.src_kind), "other"),
                        _MEMORY_KINDS.get(int(a.dst_kind), "other"),
                        int(a.correlation_id),
                        bool(a.graph_id),
                        int(a.bytes),
                    )
                )
            elif k == memory:
                if int(a.memory_operation_type) == 1 and int(a.memory_kind) == 3:  # an allocation of device memory
                    recs.allocs.append(AllocRecord(int(a.bytes), int(a.correlation_id)))
            elif k in (runtime, driver):
                domain = rt_domain if k == runtime else drv_domain
                name = names.get((domain, int(a.cbid)), "")
                recs.apis.append(
                    ApiRecord(name, int(a.start), int(a.end), int(a.thread_id) & _THREAD_MASK, int(a.correlation_id))
                )
        with self._lock:
            self._buf.append(recs)

    def flush(self) -> Records:
        self._cupti.activity_flush_all(1)  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: incomplete buffers too
        with self._lock:
            bufs, self._buf = self._buf, []
        out = Records([], [], [])
        for b in bufs:
            out.apis += b.apis
            out.copies += b.copies
            out.allocs += b.allocs
        return out

    def close(self) -> Records:
        cupti = self._cupti
        if cupti is None:
            return Records([], [], [])
        self._on_sync = None
        try:
            for k in self._kinds:
                cupti.activity_disable(k)
            if self._names:
                self._select_api_records(
                    int(cupti.CallbackDomain.RUNTIME_API), int(cupti.CallbackDomain.DRIVER_API), all_of_them=True
                )
            return self.flush()
        finally:
            self._buf = []
            if self._subscriber is not None:
                cupti.unsubscribe(self._subscriber)
            self._subscriber, self._cupti, self._kinds = None, None, ()
            if self in _CLAIMED:
                _CLAIMED.remove(self)
