"""The staging-race monitor (FC204): a pure state machine over byte ranges of pinned host memory.

A ``non_blocking`` copy whose host side is pinned is *pending* from the moment it is issued until its completion
predicate (in the torch adapter, ``event.query()`` on an event recorded right after the copy) says it arrived. A
host write to the host range of a pending copy, or a host read of the destination of a pending device-to-host copy,
is a race: the device reads (or writes) that memory whenever the stream gets to the copy. The monitor keeps the
stacks of both sides and folds races into one finding per (copy line, access line, step). No torch import here: it
is tested with synthetic copies and accesses (`flashcheck.runtime.hooks.staging` is the torch adapter).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from flashcheck.findings import Finding, Frame, Location
from flashcheck.runtime.checks.staging import PINNED_STAGING_REUSED_IN_FLIGHT
from flashcheck.runtime.stacks import user_frame, with_source

__all__ = ["Access", "Direction", "PendingCopy", "Span", "StagingMonitor", "Where"]

Direction = Literal["h2d", "d2h"]
Access = Literal["write", "read"]

_MAX_STACK_TEXT = 12  # frames of the copy's stack kept in the evidence (innermost last)


@dataclass(frozen=True)
class Span:
    """A half-open byte range ``[start, end)`` of host memory."""

    start: int
    end: int

    def overlaps(self, other: Span) -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"[{self.start:#x}, {self.end:#x})"


@dataclass(frozen=True)
class Where:
    """The region and step an observation belongs to (None: outside any region)."""

    region: str | None = None
    step: int | None = None
    step_name: str | None = None


@dataclass
class PendingCopy:
    """One tracked ``non_blocking`` copy whose host side is `span`."""

    id: int
    direction: Direction
    span: Span
    done: Callable[[], bool]
    stack: tuple[Frame, ...]
    detail: str
    where: Where


@dataclass
class _Race:
    copy: PendingCopy
    access: Access
    span: Span
    stack: tuple[Frame, ...]
    detail: str
    where: Where
    count: int = 1
    details: list[str] = field(default_factory=list)


class StagingMonitor:
    """Pending copies in, races out.

    Args:
        max_pending: at most this many copies are kept; past it the oldest completed ones are dropped first, then the
            oldest (a bound on memory when a target issues copies and never touches their buffers again).
    """

    def __init__(self, *, max_pending: int = 4096) -> None:
        self.max_pending = max_pending
        self._lock = threading.RLock()
        self._pending: list[PendingCopy] = []
        self._next_id = 1
        self._races: dict[tuple[object, ...], _Race] = {}

    # ------------------------------------------------------------------------------------------------ inputs
    @property
    def has_pending(self) -> bool:
        """True while any copy is tracked (adapters skip all range arithmetic when this is False)."""
        return bool(self._pending)

    def copy(
        self,
        direction: Direction,
        span: Span,
        *,
        done: Callable[[], bool],
        stack: tuple[Frame, ...] = (),
        detail: str = "",
        where: Where = Where(),
    ) -> int:
        """Track a copy issued now; `done()` answers whether it has completed. Returns its id."""
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self.retire()
                if len(self._pending) >= self.max_pending:
                    self._pending.pop(0)
            pc = PendingCopy(self._next_id, direction, span, done, stack, detail, where)
            self._next_id += 1
            self._pending.append(pc)
            return pc.id

    def conflicts(self, kind: Access, span: Span) -> bool:
        """Whether an access of `kind` to `span` overlaps a tracked copy it could race with (no predicate is asked:
        a cheap test before the adapter pays for a stack)."""
        return any(pc.span.overlaps(span) and not (kind == "read" and pc.direction == "h2d") for pc in self._pending)

    def access(
        self, kind: Access, span: Span, *, stack: tuple[Frame, ...] = (), detail: str = "", where: Where = Where()
    ) -> int:
        """A host write or read of `span` now; returns how many pending copies it races with."""
        with self._lock:
            if not self._pending:
                return 0
            hits = 0
            for pc in list(self._pending):
                if not pc.span.overlaps(span) or (kind == "read" and pc.direction == "h2d"):
                    continue
                if pc.done():
                    self._pending.remove(pc)
                    continue
                hits += 1
                self._record(pc, kind, span, stack, detail, where)
            return hits

    def retire(self) -> int:
        """Forget every copy whose predicate says it completed; returns how many are still pending."""
        with self._lock:
            self._pending = [pc for pc in self._pending if not pc.done()]
            return len(self._pending)

    def synchronized(self) -> None:
        """The host waited for all device work (a device synchronize): nothing is pending any more."""
        with self._lock:
            self._pending.clear()

    @property
    def pending(self) -> tuple[PendingCopy, ...]:
        return tuple(self._pending)

    # ---------------------------------------------------------------------------------------------- findings
    def _record(
        self, pc: PendingCopy, kind: Access, span: Span, stack: tuple[Frame, ...], detail: str, where: Where
    ) -> None:
        top_copy, top_access = user_frame(pc.stack), user_frame(stack)
        key = (
            (top_copy.file, top_copy.line) if top_copy else pc.id,
            (top_access.file, top_access.line) if top_access else detail,
            kind,
            where.step,
        )
        race = self._races.get(key)
        if race is None:
            self._races[key] = _Race(pc, kind, span, stack, detail, where, details=[detail] if detail else [])
            return
        race.count += 1
        if detail and detail not in race.details and len(race.details) < 8:
            race.details.append(detail)

    def drain(self) -> list[Finding]:
        """Findings since the last drain, one per (copy line, access line, access kind, step)."""
        with self._lock:
            races, self._races = list(self._races.values()), {}
        return [race_finding(r) for r in races]


def _frames_text(stack: tuple[Frame, ...]) -> list[str]:
    return [str(fr) + (f"  |  {fr.code}" if fr.code else "") for fr in with_source(stack[-_MAX_STACK_TEXT:])]


def race_finding(r: _Race) -> Finding:
    """The FC204 finding of one race: located at the host access, the copy's stack in the evidence."""
    pc = r.copy
    stack = with_source(r.stack)
    top = user_frame(stack)
    copy_top = user_frame(with_source(pc.stack))
    direction = "host-to-device" if pc.direction == "h2d" else "device-to-host"
    side = "source" if pc.direction == "h2d" else "destination"
    verb = "written" if r.access == "write" else "read"
    where = r.where
    region = f" inside `{where.region}`" if where.region else ""
    step = f" at step {where.step}" if where.step is not None else ""
    copied_at = f" issued at {copy_top.file}:{copy_top.line}" if copy_top else ""
    times = f" x{r.count}" if r.count > 1 else ""
    msg = (
        f"pinned {side} of a non_blocking {direction} copy{copied_at} {verb} by the host{times} while the copy was "
        f"still in flight{region}{step}: {', '.join(r.details) or 'no detail'}"
    )
    evidence: dict[str, object] = {
        "check": PINNED_STAGING_REUSED_IN_FLIGHT.id,
        "access": r.access,
        "direction": pc.direction,
        "copy_detail": pc.detail,
        "copy_span": str(pc.span),
        "access_span": str(r.span),
        "copy_region": pc.where.region,
        "copy_stack": _frames_text(pc.stack),
        "details": list(r.details),
        "count": r.count,
    }
    if copy_top is not None:
        evidence["copy_line"] = f"{copy_top.file}:{copy_top.line}"
        if copy_top.code:
            evidence["copy_code"] = copy_top.code
    if top is not None and top.code:
        evidence["code"] = top.code
    return PINNED_STAGING_REUSED_IN_FLIGHT.finding(
        msg,
        location=Location(
            file=top.file if top else None,
            line=top.line if top else None,
            function=top.function if top else None,
            step=where.step,
            step_name=where.step_name,
            region=where.region,
        ),
        evidence=evidence,
        stack=stack,
    )
