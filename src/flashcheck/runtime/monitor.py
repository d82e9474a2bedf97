"""The pure runtime monitor: a state machine over regions and observed events that folds them into Findings.

Torch adapters (`flashcheck.runtime.hooks`) translate what they see into `Event`s and call `Monitor.observe`; the
monitor attributes each event to the innermost open region (or to the region a deferred layer names), ignores what
happens inside `checker_read`, applies the rules of FC201/FC202/FC203 and deduplicates the same event seen by
several layers into one finding whose evidence lists the layers. No torch import here: it is tested with synthetic
event streams.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from flashcheck.check import Check
from flashcheck.findings import Finding, Frame, Location
from flashcheck.runtime.api import Region
from flashcheck.runtime.checks.allocation import ALLOCATION_IN_REPLAY
from flashcheck.runtime.checks.host_sync import HOST_SYNC_IN_REPLAY
from flashcheck.runtime.checks.pinned_copy import PINNED_COPY_CAPTURED
from flashcheck.runtime.stacks import user_frame, with_source

__all__ = [
    "HOT_REGIONS",
    "Event",
    "EventKind",
    "Layer",
    "Memory",
    "Monitor",
    "RegionRecord",
]

EventKind = Literal["sync", "d2h_copy", "h2d_copy", "alloc", "free", "pool_growth"]
Layer = Literal["sync_debug", "dispatch", "gpu_trace", "cupti", "alloc_stats", "graph_replay", "staging", "synthetic"]
Memory = Literal["pageable", "pinned", "unknown"]

# Every region a serving engine runs once per step is hot for host syncs and copies (FC201): the eager path too,
# since vLLM's piecewise mode and every non-graph batch run attention eagerly each step. Allocations (FC202) matter
# on the graph path only: eager steps allocate their outputs through the caching allocator by design.
HOT_REGIONS: frozenset[str] = frozenset({"plan", "run", "prepare_replay", "replay"})
GRAPH_PATH_REGIONS: frozenset[str] = frozenset({"prepare_replay", "replay"})
_MAX_DETAILS = 8
_get_ident = threading.get_ident


@dataclass(frozen=True)
class Event:
    """One thing a detection layer saw.

    Attributes:
        kind: ``sync`` (device/stream/event synchronize, a blocking memcpy), ``d2h_copy`` / ``h2d_copy`` (a copy
            between host and device memory; `memory` says whether the host side is pinned), ``alloc`` (a new device
            allocation), ``free``, ``pool_growth`` (the caching allocator reserved new memory).
        layer: the detection layer that saw it.
        stack: the Python stack where it happened, innermost last; empty for layers that cannot see Python
            (allocator statistics).
        detail: what exactly, e.g. ``aten._local_scalar_dense``, ``cudaStreamSynchronize``,
            ``Memcpy DtoH (Device -> Pageable)``.
        memory: host memory kind of a copy.
        in_graph: the copy was executed by a CUDA graph replay (a layer that sees graph memcpy nodes run).
        capturing: whether the calling stream was capturing a CUDA graph when the event happened (None: unknown).
            Only a copy issued *during stream capture* becomes a graph node; the plan and warm-up a target runs
            inside its ``capture`` region execute eagerly.
        nbytes: bytes copied or allocated, when known.
        count: how many occurrences this event stands for (allocator statistics report deltas).
        thread: the thread that made the call (None: unknown, e.g. allocator statistics); events from threads
            other than the one that opened the region are ignored.
        region_id: for layers that report after the region closed (allocator statistics), the region the event
            belongs to; None means "the innermost region open now".
    """

    kind: EventKind
    layer: Layer
    stack: tuple[Frame, ...] = ()
    detail: str = ""
    memory: Memory = "unknown"
    in_graph: bool = False
    capturing: bool | None = None
    nbytes: int | None = None
    count: int = 1
    thread: int | None = None
    region_id: int | None = None


@dataclass(slots=True)
class RegionRecord:
    """An open or closed region: its name, the step it belongs to, and the regions around it."""

    id: int
    name: Region
    step: int | None
    step_name: str | None
    thread: int
    enclosing: tuple[Region, ...]  # names of the regions open around it, outermost first (itself excluded)
    stack: tuple[Frame, ...] = ()  # where the region was opened (recorded when a stackless layer is active)
    closed: bool = False
    hot: str | None = None  # the outermost enclosing-or-own region name that makes this place hot (not cold)
    graph_hot: str | None = None  # the same for the rules of the graph path only (allocations)

    def names(self) -> tuple[Region, ...]:
        return (*self.enclosing, self.name)


@dataclass
class _Group:
    check: Check
    region: RegionRecord
    hot: str
    key_frame: Frame | None
    stack: tuple[Frame, ...]
    what: str
    layers: set[str] = field(default_factory=set)
    details: list[str] = field(default_factory=list)
    count: int = 0
    nbytes: int = 0
    per_layer: dict[str, int] = field(default_factory=dict)


class Monitor:
    """Regions plus events in, Findings out. Thread-aware: events count only on the thread that opened the region.

    Args:
        cold_regions: per-step regions a target declares cold (it runs them once, not every step); nothing inside
            them is reported. Default: none.
        record_region_stacks: remember where each region was opened, used as the location of events that carry no
            Python stack (allocator statistics), and keep closed regions until the next drain for the events
            those layers report later by region id. Without it a region is forgotten as it closes.
    """

    def __init__(self, *, cold_regions: Iterable[str] = (), record_region_stacks: bool = False) -> None:
        self.cold_regions = frozenset(cold_regions)
        self.record_region_stacks = record_region_stacks
        self._lock = threading.RLock()
        self._open: list[RegionRecord] = []
        self._regions: dict[int, RegionRecord] = {}
        self._ids = itertools.count(1)
        # per region name: hot by itself (not cold), and hot on the graph path; regions open twice per engine step
        self._hot_names = HOT_REGIONS - self.cold_regions
        self._graph_names = GRAPH_PATH_REGIONS - self.cold_regions
        self._reading: dict[int, int] = {}  # thread -> checker_read depth
        self._groups: dict[tuple[Check, int, tuple[str, int] | None], _Group] = {}
        self._order: list[tuple[Check, int, tuple[str, int] | None]] = []
        self._stackless: list[tuple[Check, RegionRecord, str, Event]] = []
        self.ignored = 0  # events seen outside any region or inside checker_read (for diagnostics)
        # one record per distinct place a region opened (its enclosing names and its own): what was watched
        self._places: dict[object, RegionRecord] = {}

    # ----------------------------------------------------------------------------------------------- regions
    def enter(
        self,
        name: Region,
        *,
        step: int | None = None,
        step_name: str | None = None,
        thread: int | None = None,
        stack: tuple[Frame, ...] = (),
    ) -> RegionRecord:
        """Open region `name` inside the regions open now; returns its record."""
        rec = RegionRecord(0, name, step, step_name, 0, (), stack if self.record_region_stacks else ())
        self.open(rec, thread)
        return rec

    def open(self, rec: RegionRecord, thread: int | None = None) -> None:
        """Open `rec` (its name, step and stack set): give it an id, its thread and enclosing regions, and whether it
        is hot. Lock-free: list and dict updates are atomic under the GIL, and an engine opens two regions per step,
        so every instruction here counts."""
        open_ = self._open
        name = rec.name
        place: object = name  # a top-level region's place is its name: no tuple on the common path
        if open_:
            parent = open_[-1]
            rec.enclosing = (*parent.enclosing, parent.name)
            rec.hot = parent.hot or (name if name in self._hot_names else None)
            rec.graph_hot = parent.graph_hot or (name if name in self._graph_names else None)
            place = (rec.enclosing, name)
        else:
            rec.enclosing = ()
            rec.hot = name if name in self._hot_names else None
            rec.graph_hot = name if name in self._graph_names else None
        rec.id = rid = next(self._ids)
        rec.thread = _get_ident() if thread is None else thread
        rec.closed = False
        if self.record_region_stacks:  # layers that report later name regions by id, closed ones too
            self._regions[rid] = rec
        if place not in self._places:
            self._places[place] = rec
        open_.append(rec)

    def places(self) -> tuple[RegionRecord, ...]:
        """One record per distinct place a region was opened so far (its name inside the same enclosing regions)."""
        return tuple(self._places.values())

    def probe(self, name: Region) -> RegionRecord:
        """The record region `name` would have if opened at the top level now (hot or cold as this monitor's
        cold regions say), without opening it: what could be watched there."""
        return RegionRecord(
            0,
            name,
            None,
            None,
            0,
            (),
            hot=name if name in self._hot_names else None,
            graph_hot=name if name in self._graph_names else None,
        )

    def rule(self, ev: Event, rec: RegionRecord) -> Check | None:
        """The check whose rule `ev` would fall under inside `rec` (None: harmless there)."""
        rule = self._classify(ev, rec)
        return rule[0] if rule is not None else None

    def exit(self, rec: RegionRecord) -> None:
        open_ = self._open
        if not open_ or open_[-1] is not rec:
            opened = " > ".join(r.name for r in open_) or "none"
            raise RuntimeError(f"region {rec.name!r} (id {rec.id}) closed out of order; open regions: {opened}")
        open_.pop()
        rec.closed = True

    @property
    def any_open(self) -> bool:
        return bool(self._open)

    def watching(self, thread: int) -> bool:
        """Whether an event of `thread` now can count: its innermost open region is hot and the checker is not
        reading on it."""
        if self._reading.get(thread, 0) > 0:
            return False
        rec = self._innermost(thread)
        return rec is not None and rec.hot is not None

    @property
    def open_regions(self) -> tuple[RegionRecord, ...]:
        """The regions open now, outermost first."""
        return tuple(self._open)

    def region(self, region_id: int) -> RegionRecord | None:
        rec = self._regions.get(region_id)
        if rec is None:  # without a deferred layer only the open regions are known
            rec = next((r for r in self._open if r.id == region_id), None)
        return rec

    def begin_read(self, thread: int | None = None) -> None:
        t = threading.get_ident() if thread is None else thread
        with self._lock:
            self._reading[t] = self._reading.get(t, 0) + 1

    def end_read(self, thread: int | None = None) -> None:
        t = threading.get_ident() if thread is None else thread
        with self._lock:
            depth = self._reading.get(t, 0) - 1
            if depth < 0:
                raise RuntimeError("checker_read closed more often than opened")
            if depth:
                self._reading[t] = depth
            else:
                self._reading.pop(t, None)

    def reading(self, thread: int | None = None) -> bool:
        return self._reading.get(threading.get_ident() if thread is None else thread, 0) > 0

    # ------------------------------------------------------------------------------------------------ events
    def observe(self, ev: Event) -> None:
        """Attribute one event to a region and fold it into the pending findings (cheap when it is harmless)."""
        with self._lock:
            if ev.region_id is not None:
                rec = self.region(ev.region_id)
            else:
                if ev.thread is not None and self._reading.get(ev.thread, 0) > 0:
                    self.ignored += 1
                    return
                rec = self._innermost(ev.thread)
            if rec is None:
                self.ignored += 1
                return
            rule = self._classify(ev, rec)
            if rule is None:
                return
            check, hot, what = rule
            if not ev.stack:
                self._stackless.append((check, rec, hot, ev))
                return
            self._add(check, rec, hot, what, ev)

    def _innermost(self, thread: int | None) -> RegionRecord | None:
        for rec in reversed(self._open):
            if thread is None or rec.thread == thread:
                return rec
        return None

    def _classify(self, ev: Event, rec: RegionRecord) -> tuple[Check, str, str] | None:
        names = rec.names()
        hot = rec.hot
        copy = ev.kind in ("d2h_copy", "h2d_copy")
        captured = "capture" in names and ev.capturing is not False
        if copy and ev.memory == "pinned" and (captured or (ev.in_graph and hot is not None)):
            where = "capture" if "capture" in names else (hot or rec.name)
            direction = "device-to-host" if ev.kind == "d2h_copy" else "host-to-device"
            return PINNED_COPY_CAPTURED, where, f"{direction} copy of pinned host memory captured into a CUDA graph"
        if hot is None or ev.in_graph:
            return None
        if ev.kind == "sync":
            return HOST_SYNC_IN_REPLAY, hot, "host synchronization"
        if ev.kind == "d2h_copy":
            return HOST_SYNC_IN_REPLAY, hot, "device-to-host copy"
        if ev.kind == "h2d_copy" and ev.memory == "pageable":
            return HOST_SYNC_IN_REPLAY, hot, "host-to-device copy from pageable memory (a blocking staging copy)"
        graph_hot = rec.graph_hot
        if graph_hot is None:
            return None
        if ev.kind == "alloc":
            return ALLOCATION_IN_REPLAY, graph_hot, "device memory allocation"
        if ev.kind == "pool_growth":
            return ALLOCATION_IN_REPLAY, graph_hot, "caching-allocator pool growth (new device memory reserved)"
        return None

    def _add(self, check: Check, rec: RegionRecord, hot: str, what: str, ev: Event) -> None:
        top = user_frame(ev.stack) if ev.stack else None
        key = (check, rec.id, (top.file, top.line) if top is not None else None)
        g = self._groups.get(key)
        if g is None:
            g = _Group(check, rec, hot, top, ev.stack or rec.stack, what)
            self._groups[key] = g
            self._order.append(key)
        self._fold(g, ev)

    @staticmethod
    def _fold(g: _Group, ev: Event) -> None:
        g.layers.add(ev.layer)
        if ev.detail and ev.detail not in g.details and len(g.details) < _MAX_DETAILS:
            g.details.append(ev.detail)
        # Several layers report the same occurrence; count the occurrences of the layer that reported most.
        g.per_layer[ev.layer] = g.per_layer.get(ev.layer, 0) + ev.count
        g.count = max(g.per_layer.values())
        g.nbytes += ev.nbytes or 0

    # ---------------------------------------------------------------------------------------------- findings
    def drain(self) -> list[Finding]:
        """Findings since the last drain, one per (check, region, user line); closed regions are forgotten."""
        with self._lock:
            for check, rec, hot, ev in self._stackless:
                # An event without a stack merges into a finding of the same check and region seen with one.
                match = next((k for k in self._order if k[0] == check and k[1] == rec.id), None)
                if match is not None:
                    self._fold(self._groups[match], ev)
                else:
                    rule = self._classify(ev, rec)
                    assert rule is not None
                    self._add(check, rec, hot, rule[2], ev)
            self._stackless.clear()
            out = [self._finding(self._groups[k]) for k in self._order]
            self._groups.clear()
            self._order.clear()
            for i, r in list(self._regions.items()):  # a copy: another thread may open a region meanwhile
                if r.closed:
                    del self._regions[i]
            return out

    def _finding(self, g: _Group) -> Finding:
        rec = g.region
        layers = sorted(g.layers)
        stack = with_source(g.stack)
        top = user_frame(stack) if g.key_frame is not None else None
        where = f"`{g.hot}`" + (f" (inside `{rec.name}`)" if rec.name != g.hot else "")
        step = f" at step {rec.step}" if rec.step is not None else ""
        detail = ", ".join(g.details) if g.details else "no detail"
        times = f" x{g.count}" if g.count > 1 else ""
        seen = ", ".join(layers)
        msg = f"{g.what}{times} inside {where}{step}: {detail} (seen by {seen})"
        if top is None:
            msg += "; no Python stack: only layers without one saw it, the location is where the region was opened"
            top = user_frame(with_source(rec.stack)) if rec.stack else None
        loc = Location(
            file=top.file if top else None,
            line=top.line if top else None,
            function=top.function if top else None,
            step=rec.step,
            step_name=rec.step_name,
            region=g.hot,
        )
        evidence: dict[str, object] = {
            "check": g.check.id,
            "region": rec.name,
            "regions": list(rec.names()),
            "layers": layers,
            "details": list(g.details),
            "count": g.count,
        }
        if g.nbytes:
            evidence["nbytes"] = g.nbytes
        if top is not None and top.code:
            evidence["code"] = top.code
        return g.check.finding(msg, location=loc, evidence=evidence, stack=stack)
