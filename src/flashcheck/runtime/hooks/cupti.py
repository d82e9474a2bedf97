"""Layer ``cupti``: CUPTI through ``torch.profiler`` (Kineto), read after the fact and attributed by time.

Catches every memcpy with its kind (``Memcpy DtoH (Device -> Pageable)``, ``... -> Pinned``, ``Memcpy HtoD
(Pageable -> Device)`` ...) and the blocking runtime/driver calls (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
``cudaEventSynchronize``, synchronous ``cudaMemcpy``), including those made inside C++ extensions such as
FlashInfer's ``plan()``: the only layer that sees those (measured on an H100). Misses: nothing of interest, but
it has no Python stacks (the location of a CUPTI-only finding is where its region was opened) and needs a GPU.
Cost: +1-3 µs per op while the profiler runs (the whole checker session in ``layers="all"``), plus a profiler
restart at each drain.

Each region is bracketed by a ``record_function`` marker ``flashcheck:region:<id>`` and each ``checker_read`` by
``flashcheck:read``; at drain time the profiler is stopped, the raw Kineto events are read, every interesting event
is attributed to the innermost marker whose time range contains it (a GPU memcpy by the time of the runtime call
that launched it, found by CUPTI correlation id), and the profiler is restarted.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from flashcheck.runtime.hooks.base import EventSink, Hook
from flashcheck.runtime.monitor import Event, EventKind, Memory, RegionRecord

__all__ = ["READ_MARKER", "REGION_MARKER", "CuptiHook", "RawEvent", "attribute", "raw_events"]

REGION_MARKER = "flashcheck:region:"
READ_MARKER = "flashcheck:read"
SYNC_APIS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpyFromSymbol",
        "cudaMemcpyToSymbol",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuMemcpyDtoH",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD",
        "cuMemcpyHtoD_v2",
        "cuMemcpy",
    }
)
_MEMCPY_RE = re.compile(r"^Memcpy (\w+)(?: \(([\w ]+) -> ([\w ]+)\))?")
_MEMORY: dict[str, Memory] = {"Pageable": "pageable", "Pinned": "pinned"}


@dataclass(frozen=True)
class RawEvent:
    """The fields of a Kineto event this layer uses (tests build these directly)."""

    name: str
    start_ns: int
    end_ns: int
    correlation: int = 0
    on_device: bool = False
    thread: int = 0


def raw_events(kineto_events: Sequence[Any]) -> list[RawEvent]:
    """Convert ``prof.profiler.kineto_results.events()`` to `RawEvent`s."""
    out = []
    for e in kineto_events:
        start = int(e.start_ns())
        on_device = not str(e.device_type()).endswith("CPU")
        out.append(
            RawEvent(
                e.name(),
                start,
                start + int(e.duration_ns()),
                int(e.correlation_id()),
                on_device,
                int(e.start_thread_id()),
            )
        )
    return out


def _classify(name: str) -> tuple[EventKind, Memory] | None:
    if name in SYNC_APIS:
        return "sync", "unknown"
    m = _MEMCPY_RE.match(name)
    if m is None:
        return None
    direction, src, dst = m.group(1), m.group(2) or "", m.group(3) or ""
    if direction == "DtoH":
        return "d2h_copy", _MEMORY.get(dst, "unknown")
    if direction == "HtoD":
        return "h2d_copy", _MEMORY.get(src, "unknown")
    return None


def attribute(raws: Sequence[RawEvent]) -> list[Event]:
    """Events attributed to the innermost region marker containing them; events inside read markers are dropped."""
    # Attribution is by time only: Kineto's thread ids for torch ops and for CUPTI runtime records come from
    # different numbering schemes, so matching them would silently drop events. Regions are opened by one driver
    # thread; a sync made by another thread during a region is attributed to it (documented limitation).
    regions: list[tuple[int, int, int]] = []  # start, end, region id
    reads: list[tuple[int, int]] = []
    launches: dict[int, RawEvent] = {}
    for r in raws:
        if r.name.startswith(REGION_MARKER):
            regions.append((r.start_ns, r.end_ns, int(r.name[len(REGION_MARKER) :])))
        elif r.name == READ_MARKER:
            reads.append((r.start_ns, r.end_ns))
        elif not r.on_device and r.name.startswith("cu") and r.correlation:
            launches[r.correlation] = r
    if not regions:
        return []
    out: list[Event] = []
    for r in raws:
        hit = _classify(r.name)
        if hit is None:
            continue
        kind, memory = hit
        t, in_graph = r.start_ns, False
        if r.on_device:
            launch = launches.get(r.correlation)  # a GPU copy counts where the host launched it
            if launch is not None:
                t, in_graph = launch.start_ns, "Graph" in launch.name
        if any(s <= t <= e for s, e in reads):
            continue
        best: tuple[int, int] | None = None
        for s, e, rid in regions:
            if s <= t <= e and (best is None or s > best[0]):
                best = (s, rid)
        if best is None:
            continue
        # a copy CUPTI saw execute was not being captured (captured copies run only at replay, as in_graph)
        out.append(
            Event(kind, "cupti", (), r.name, memory=memory, in_graph=in_graph, region_id=best[1], capturing=False)
        )
    return out


def _default_profiler() -> Any:
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=acts)


_RUNNING: list[CuptiHook] = []  # the hook whose profiler runs: Kineto has one per process


class CuptiHook(Hook):
    """Runs ``torch.profiler`` for the checker session and turns its CUDA events into monitor events at drain.

    Args:
        profiler_factory: builds a fresh, not yet started ``torch.profiler.profile`` (the default records CPU and
            CUDA activities); tests on CPU pass one with CPU activity only.
    """

    layer = "cupti"

    def __init__(
        self, *, profiler_factory: Callable[[], Any] | None = None, available: Callable[[], bool] | None = None
    ) -> None:
        super().__init__()
        self._factory = profiler_factory or _default_profiler
        self._available = available
        self._prof: Any = None
        self._markers: dict[int, Any] = {}
        self._read_markers: list[Any] = []
        self._pending: list[Event] = []

    def unavailable_reason(self) -> str | None:
        if _RUNNING and _RUNNING[0] is not self:
            return "another checker's CUPTI layer is active in this process (Kineto runs one profiler per process)"
        if self._available is not None:
            return None if self._available() else "no CUDA device"
        import torch

        return None if torch.cuda.is_available() else "no CUDA device (CUPTI needs one)"

    def _install(self, sink: EventSink) -> None:
        self._pending = []
        self._start()
        _RUNNING.append(self)

    def _start(self) -> None:
        with _quiet_profiler():
            prof = self._factory()
            prof.start()
        self._prof = prof

    def _stop(self) -> list[Event]:
        prof, self._prof = self._prof, None
        if prof is None:
            return []
        with _quiet_profiler():
            prof.stop()
        return attribute(raw_events(prof.profiler.kineto_results.events()))

    def _uninstall(self) -> None:
        for m in reversed(self._read_markers):
            m.__exit__(None, None, None)
        for m in reversed(list(self._markers.values())):
            m.__exit__(None, None, None)
        self._read_markers, self._markers = [], {}
        try:
            self._pending.extend(self._stop())
        finally:
            if self in _RUNNING:
                _RUNNING.remove(self)

    def _marker(self, name: str) -> Any:
        import torch

        m = torch.profiler.record_function(name)
        m.__enter__()  # type: ignore[no-untyped-call]
        return m

    def region_enter(self, rec: RegionRecord, hot: bool) -> None:
        if self._prof is not None:
            self._markers[rec.id] = self._marker(f"{REGION_MARKER}{rec.id}")

    def region_exit(self, rec: RegionRecord, hot: bool) -> None:
        m = self._markers.pop(rec.id, None)
        if m is not None:
            m.__exit__(None, None, None)

    def read_begin(self) -> None:
        if self._prof is not None:
            self._read_markers.append(self._marker(READ_MARKER))

    def read_end(self) -> None:
        if self._read_markers:
            self._read_markers.pop().__exit__(None, None, None)

    def collect(self) -> list[Event]:
        """Stop the profiler, attribute its events, restart it (only call with no region or read open)."""
        out, self._pending = self._pending, []
        if self._prof is not None and not self._markers and not self._read_markers:
            try:
                out.extend(self._stop())
            finally:
                self._start()
        return out


@contextlib.contextmanager
def _quiet_profiler() -> Iterator[None]:
    """Hide torch's "Warning: Profiler clears events at the end of each cycle" (we read every cycle). The filter's
    pattern is matched from the start of the message, which begins with "Warning: "."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*Profiler clears events", category=UserWarning)
        yield
