"""`Checker`: the runtime checker as a context manager (implements `CheckerLike`).

On enter it installs the selected detection hooks (torch is imported then, not before); regions attribute what the
hooks see to ``plan``/``run``/``capture``/``prepare_replay``/``replay``; ``checker_read()`` marks the checker's own
reads; ``drain_findings()`` returns the FC2xx findings of the monitor plus the FC302 findings of the arena. On exit
every hook is removed and what it replaced restored. A checker that is not entered has nothing installed.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from flashcheck.errors import InvalidArgument, UsageError
from flashcheck.findings import Finding
from flashcheck.runtime.api import REGIONS, Region
from flashcheck.runtime.arena import GUARD_BYTES, Arena
from flashcheck.runtime.hooks import Hook, HookError, LayerSpec, build_hooks
from flashcheck.runtime.monitor import Event, Monitor, RegionRecord
from flashcheck.runtime.stacks import capture_stack

__all__ = ["Checker"]

_NO_REGION: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
_WARNED: set[tuple[str, str]] = set()  # (layer, reason) already warned about in this process


def _warn_skipped_on_a_gpu(skipped: dict[str, str]) -> None:
    """A layer that cannot run on a machine that has a CUDA device (no ``cupti-python``, CUPTI held by
    ``torch.profiler``) is news the run must not keep to itself: one RuntimeWarning per layer and reason. Without a
    device every CUDA layer is skipped by design (CPU CI), and nothing is said."""
    torch = sys.modules.get("torch")
    if not skipped or torch is None or not torch.cuda.is_available():
        return
    for layer, reason in skipped.items():
        if (layer, reason) not in _WARNED:
            _WARNED.add((layer, reason))
            warnings.warn(
                f"flashcheck: detection layer {layer!r} is skipped on this CUDA machine: {reason}; what only it "
                "sees is not watched in this run (Checker.skipped_layers lists it)",
                RuntimeWarning,
                stacklevel=3,
            )


class Checker:
    """Observe what a target does while it plans, runs, captures and replays; report it as Findings.

    Args:
        layers: ``"cheap"`` (sync debug mode, gpu trace, replay wrapper, dispatch mode during capture), ``"all"``
            (+ CUPTI callbacks; dispatch mode in hot regions where CUPTI cannot run), ``"races"`` (``all`` + the
            staging layer, FC204), or a list of layer names / `Hook` objects.
        cold_regions: per-step regions the target declares cold (see `flashcheck.runtime.monitor.Monitor`).
        device: default device of arena workspaces and of allocator statistics (default: ``cuda`` when available,
            else ``cpu``).
        guard_bytes: size of the arena's guard zones.

    Example::

        with Checker(layers="cheap") as chk:
            ws = chk.arena.workspace("float", 128 << 20, device="cuda")
            ...
            with chk.region("replay", step=i):
                graph.replay()
            findings = chk.drain_findings()
    """

    def __init__(
        self,
        layers: LayerSpec = "cheap",
        *,
        cold_regions: Iterable[str] = (),
        device: Any = None,
        guard_bytes: int = GUARD_BYTES,
    ) -> None:
        self._spec = layers
        self._hooks: list[Hook] = build_hooks(layers, device=device)
        self.device = device
        stackless = any(h.layer == "alloc_stats" for h in self._hooks)
        self.monitor = Monitor(cold_regions=cold_regions, record_region_stacks=stackless)
        self._arena = Arena(guard_bytes=guard_bytes, reader=self.checker_read, sink=self._arena_findings)
        self._pending: list[Finding] = []
        self._installed: list[Hook] = []
        self._region_hooks: dict[str, tuple[Hook, ...]] = {}  # per region name: the hooks that act on it
        self._refresh: tuple[Hook, ...] = ()  # hooks re-checked when an outermost region opens
        self._readers: tuple[Hook, ...] = ()  # hooks told about the checker's own reads (the others are not called)
        self._errors: list[tuple[str, BaseException]] = []
        self._entered = False
        self._owner: int | None = None
        self.active_layers: list[str] = []
        self.skipped_layers: dict[str, str] = {}
        # `exercised` for so many places (they only grow) and `applicable`, kept from exit on
        self._seen: tuple[int, frozenset[str]] = (0, frozenset())
        self._applicable: frozenset[str] | None = None

    # ------------------------------------------------------------------------------------------ life cycle
    def __enter__(self) -> Checker:
        if self._entered:
            raise UsageError("this Checker is already active; a checker is entered once at a time")
        self.active_layers, self.skipped_layers = [], {}
        self._seen, self._applicable = (-1, frozenset()), None
        installed: list[Hook] = []
        try:
            for h in self._hooks:
                reason = h.unavailable_reason()
                if reason is not None:
                    self.skipped_layers[h.layer] = reason
                    continue
                h.install(self)
                installed.append(h)
        except BaseException:
            for h in reversed(installed):
                h.uninstall()
            raise
        self._installed = installed
        for h in installed:
            h.layers_skipped(self.skipped_layers)
        _warn_skipped_on_a_gpu(self.skipped_layers)
        # hooks that act on regions, per region name: the others (the base class's no-ops) are not called twice
        # per region, which is what the cheap layers cost on an engine's replay loop
        acting = [h for h in installed if _acts_on_regions(h)]
        self._region_hooks = {n: tuple(h for h in acting if _wants(h, n)) for n in REGIONS}
        self._refresh = tuple(h for h in installed if type(h).refresh is not Hook.refresh)
        self._readers = tuple(h for h in installed if _acts_on_reads(h))
        self.active_layers = [h.layer for h in installed]
        self._entered = True
        self._owner = threading.get_ident()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._entered:
            return
        try:
            if not self.monitor.any_open:
                self._collect_deferred()
        finally:
            self.exercised()  # both kept while the hooks still say what they watch
            self.applicable()
            for h in reversed(self._installed):
                try:
                    h.uninstall()
                except Exception as e:
                    self._errors.append((h.layer, e))
            self._entered = False
        for h in self._installed:
            for ev in h.collect():  # what a deferred layer flushed while uninstalling
                self.monitor.observe(ev)
        self._installed, self._region_hooks, self._refresh, self._readers = [], {}, (), ()
        if exc_type is None:
            self._raise_hook_errors()

    @property
    def active(self) -> bool:
        return self._entered

    def hook(self, layer: str) -> Hook | None:
        """The hook of detection layer `layer` (installed or not), or None when it was not selected."""
        return next((h for h in self._hooks if h.layer == layer), None)

    def exercised(self) -> frozenset[str]:
        """IDs of the runtime checks that watched something so far: a region opened at a place where an active
        detection layer reports events that one of their rules applies to there (or folds the check itself). After
        exit: what it was at exit."""
        places = self.monitor.places()
        if self._entered and self._seen[0] != len(places):
            self._seen = (len(places), self._witnessed(places))
        return self._seen[1]

    def applicable(self) -> frozenset[str]:
        """IDs of the runtime checks that an active layer could witness in some region a driver opens (each of
        `REGIONS` at the top level, with this checker's cold regions): any other runtime check cannot apply here,
        its layers being skipped or not selected."""
        if self._applicable is None and self._entered:
            self._applicable = self._witnessed(tuple(self.monitor.probe(n) for n in REGIONS))
        return self._applicable or frozenset()

    def _witnessed(self, places: Iterable[RegionRecord]) -> frozenset[str]:
        ids: set[str] = set()
        for rec in places:
            for h in self._installed:
                if not h.watches(rec):
                    continue
                ids.update(h.folds)
                for ev in h.reports:
                    check = self.monitor.rule(ev, rec)
                    if check is not None:
                        ids.add(check.id)
        return frozenset(ids)

    # ---------------------------------------------------------------------------------------- CheckerLike
    @property
    def arena(self) -> Arena:
        return self._arena

    def region(
        self, name: Region, *, step: int | None = None, step_name: str | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Attribute everything inside to region `name` of `step` (regions nest; the innermost one wins)."""
        hooks = self._region_hooks.get(name)
        if hooks is None:
            if name not in REGIONS:
                raise InvalidArgument(f"region {name!r} is not one of {', '.join(REGIONS)}")
            raise UsageError("open regions inside `with Checker(...) as checker:`; this checker is not active")
        return _Region(self, name, step, step_name, hooks)

    def checker_read(self) -> contextlib.AbstractContextManager[None]:
        """The checker's own reads (CSR checks, scans, comparisons): nothing inside ever counts."""
        return _Read(self)

    def drain_findings(self) -> list[Finding]:
        """Findings since the last drain: runtime detectors (FC2xx, FC204 of the staging layer included) and arena
        scans (FC302).

        Deferred layers are read here when no region is open; raises `HookError` if a hook failed.
        """
        if self._entered and not self.monitor.any_open:
            self._collect_deferred()
        out = self.monitor.drain() + self._pending
        self._pending = []
        for h in self._hooks:
            out += h.findings()
        self._raise_hook_errors()
        return out

    # ------------------------------------------------------------------------------------- EventSink side
    def emit(self, event: Event) -> None:
        self.monitor.observe(event)

    def hook_error(self, layer: str, exc: BaseException) -> None:
        self._errors.append((layer, exc))

    def reading(self) -> bool:
        return self.monitor.reading()

    def watching(self, thread: int) -> bool:
        return self.monitor.watching(thread)

    def region_open(self) -> bool:
        return self.monitor.any_open

    def implicit_region(self, name: str) -> contextlib.AbstractContextManager[None]:
        if self.monitor.any_open or not self._entered or name not in REGIONS:
            return _NO_REGION  # called around every graph replay: no generator when a region is open already
        return self.region(name)

    # ------------------------------------------------------------------------------------------- internals
    def _arena_findings(self, findings: list[Finding]) -> None:
        self._pending.extend(findings)

    def _collect_deferred(self) -> None:
        for h in self._installed:
            try:
                events = h.collect()
            except Exception as e:
                self._errors.append((h.layer, e))
                continue
            for ev in events:
                self.monitor.observe(ev)

    def _raise_hook_errors(self) -> None:
        if self._errors:
            errors, self._errors = self._errors, []
            raise HookError(errors)

    def __repr__(self) -> str:
        state = f"active layers {self.active_layers}" if self._entered else "inactive"
        return f"Checker(layers={self._spec!r}, {state})"


class _Region(RegionRecord):
    """One region: its record, and the context manager that opens it (a plain class, not a generator, and one
    object: regions open twice per engine step, so their cost counts)."""

    __slots__ = ("_chk", "_entered", "_hooks")

    def __init__(
        self, chk: Checker, name: Region, step: int | None, step_name: str | None, hooks: tuple[Hook, ...]
    ) -> None:
        self.name, self.step, self.step_name, self.stack = name, step, step_name, ()
        self._chk, self._hooks, self._entered = chk, hooks, 0

    def __enter__(self) -> None:
        chk = self._chk
        mon = chk.monitor
        if chk._refresh and not mon._open:
            for h in chk._refresh:
                h.refresh()
        if mon.record_region_stacks:
            self.stack = capture_stack(2)
        mon.open(self)
        if self._hooks:
            hot = self.hot is not None
            try:
                for h in self._hooks:
                    h.region_enter(self, hot)
                    self._entered += 1
            except BaseException:
                self.__exit__(None, None, None)
                raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._entered:
                hot = self.hot is not None
                for h in reversed(self._hooks[: self._entered]):
                    h.region_exit(self, hot)
        finally:
            self._entered = 0
            open_ = self._chk.monitor._open
            if open_ and open_[-1] is self:  # `Monitor.exit` without its call, for the usual case
                open_.pop()
                self.closed = True
            else:
                self._chk.monitor.exit(self)  # raises: closed out of order


class _Read:
    """One `Checker.checker_read` (a plain class: the driver opens about twenty per step)."""

    __slots__ = ("_begun", "_chk")

    def __init__(self, chk: Checker) -> None:
        self._chk = chk
        self._begun: list[Hook] = []

    def __enter__(self) -> None:
        chk = self._chk
        chk.monitor.begin_read()
        readers = chk._readers if chk._entered else ()
        done = not readers
        try:
            for h in readers:
                h.read_begin()
                self._begun.append(h)
            done = True
        finally:
            if not done:  # a hook failed to begin: end the ones that did, and the read
                self.__exit__(None, None, None)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        begun, self._begun = self._begun, []
        try:
            for h in reversed(begun):
                h.read_end()
        finally:
            self._chk.monitor.end_read()


def _acts_on_reads(h: Hook) -> bool:
    cls = type(h)
    return cls.read_begin is not Hook.read_begin or cls.read_end is not Hook.read_end


def _acts_on_regions(h: Hook) -> bool:
    cls = type(h)
    return cls.region_enter is not Hook.region_enter or cls.region_exit is not Hook.region_exit


def _wants(h: Hook, name: str) -> bool:
    names = h.region_names()
    return names is None or name in names
