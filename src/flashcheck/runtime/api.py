"""The interface between targets/drivers and the runtime checker (pure typing, no torch).

A driver opens a *region* around every target call (``setup``, ``plan``, ``run``, ``capture``, ``prepare_replay``,
``replay``); detectors attribute events to the innermost open region. Reads the checker itself makes (CSR checks
of device buffers, high-water-mark scans, output comparisons) happen inside ``checker_read()`` and never count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal, Protocol, runtime_checkable

from flashcheck.findings import Finding

__all__ = ["REGIONS", "ArenaLike", "CheckerLike", "NullChecker", "Region", "WorkspaceKind"]

Region = Literal["setup", "plan", "run", "capture", "prepare_replay", "replay"]
REGIONS: tuple[Region, ...] = ("setup", "plan", "run", "capture", "prepare_replay", "replay")
WorkspaceKind = Literal["float", "int", "pinned", "engine"]


@runtime_checkable
class ArenaLike(Protocol):
    """Hands out workspaces with guard zones and measures their use."""

    def workspace(
        self, name: str, nbytes: int, *, device: Any, kind: WorkspaceKind = "float", zero: bool = True
    ) -> Any:
        """A uint8 tensor of exactly `nbytes` on `device`, with guard zones around it."""
        ...

    def arm(self) -> None:
        """Sentinel-fill the usable region of every workspace that tolerates it (before plan / prepare)."""
        ...

    def scan(self, step: int | None = None) -> tuple[list[Finding], dict[str, tuple[int, int]]]:
        """After run / replay: (FC302 findings, name -> (used bytes, allocated bytes))."""
        ...

    def probe(self) -> Any:
        """A scan's first half: launch the device-side reductions (`flashcheck.runtime.arena.ArenaProbe`)."""
        ...

    def account(
        self, probe: Any, rows: list[list[list[int]]], step: int | None = None
    ) -> tuple[list[Finding], dict[str, tuple[int, int]]]:
        """A scan's second half: the findings and usage of `probe`'s results, read to the host (`rows`)."""
        ...


@runtime_checkable
class CheckerLike(Protocol):
    """What a driver needs from the runtime checker."""

    @property
    def arena(self) -> ArenaLike: ...

    def region(
        self, name: Region, *, step: int | None = None, step_name: str | None = None
    ) -> contextlib.AbstractContextManager[None]: ...

    def checker_read(self) -> contextlib.AbstractContextManager[None]: ...

    def drain_findings(self) -> list[Finding]:
        """Findings produced since the last drain (runtime detectors, arena), deduplicated per step."""
        ...


class NullChecker:
    """Regions without any detector: what a driver uses when runtime checks are off. Costs nothing."""

    def __init__(self, arena: ArenaLike) -> None:
        self._arena = arena

    @property
    def arena(self) -> ArenaLike:
        return self._arena

    @contextlib.contextmanager
    def region(self, name: Region, *, step: int | None = None, step_name: str | None = None) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def checker_read(self) -> Iterator[None]:
        yield

    def drain_findings(self) -> list[Finding]:
        return []
