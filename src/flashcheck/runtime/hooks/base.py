"""What every torch adapter shares: the `Hook` life cycle (idempotent install/uninstall) and the sink it reports to.

A hook never swallows its own errors: an exception inside a callback that torch would only log (gpu-trace callbacks)
or that would break the user's program (a warning hook) is handed to `EventSink.hook_error`, and the checker raises
`HookError` at the next drain or on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import ClassVar, Protocol

from flashcheck.errors import FlashcheckError
from flashcheck.findings import Finding
from flashcheck.runtime.monitor import Event, Layer, RegionRecord

__all__ = ["EventSink", "Hook", "HookError"]


class HookError(FlashcheckError):
    """A detection hook failed; the code it should have watched is unchecked. `errors` holds (layer, exception)."""

    def __init__(self, errors: list[tuple[str, BaseException]]) -> None:
        self.errors = list(errors)
        lines = "\n".join(f"  {layer}: {type(e).__name__}: {e}" for layer, e in self.errors[:10])
        n = len(self.errors)
        super().__init__(f"{n} detection hook error(s); the watched code was not fully checked:\n{lines}")


class EventSink(Protocol):
    """Where hooks send what they see (the checker)."""

    def emit(self, event: Event) -> None: ...

    def hook_error(self, layer: str, exc: BaseException) -> None: ...

    def reading(self) -> bool:
        """True inside ``checker_read()`` on the calling thread (hooks may skip work then)."""
        ...

    def region_open(self) -> bool:
        """True while any region is open (on any thread)."""
        ...

    def watching(self, thread: int) -> bool:
        """True while the innermost region open on `thread` (the calling one) is hot (see
        `flashcheck.runtime.monitor.HOT_REGIONS`) and the checker is not reading on it: what a hook asks on its
        per-call path before it does any work."""
        ...

    def implicit_region(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A region opened by a hook (e.g. around ``CUDAGraph.replay``) when the driver has none open."""
        ...


class Hook:
    """Base of the torch adapters. Subclasses implement `_install`/`_uninstall` and the region callbacks they need.

    `install` and `uninstall` are idempotent; `uninstall` restores exactly what `install` replaced, unless somebody
    else wrapped on top of it meanwhile, in which case the hook stays in the chain but turns inert.
    """

    layer: ClassVar[Layer]
    # What the layer can witness (`Checker.exercised`): prototypes of the events it reports, which the monitor's rules
    # classify, and the IDs of the checks whose findings it folds itself (FC204 of the staging layer).
    reports: ClassVar[tuple[Event, ...]] = ()
    folds: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.installed = False
        self._sink: EventSink | None = None

    def unavailable_reason(self) -> str | None:
        """Why this layer cannot run here (no CUDA device...), or None."""
        return None

    def install(self, sink: EventSink) -> None:
        if self.installed:
            return
        self._sink = sink
        self._install(sink)
        self.installed = True

    def uninstall(self) -> None:
        if not self.installed:
            return
        try:
            self._uninstall()
        finally:
            self.installed = False
            self._sink = None

    def _install(self, sink: EventSink) -> None:
        raise NotImplementedError

    def _uninstall(self) -> None:
        raise NotImplementedError

    # Region and read notifications (called by the checker; `hot` says whether replay rules apply).
    def region_names(self) -> frozenset[str] | None:
        """The region names whose `region_enter`/`region_exit` this hook acts on (None: every region). The checker
        calls a hook only for these: an engine opens two regions per step, so a call that does nothing still costs."""
        return None

    def watches(self, rec: RegionRecord) -> bool:
        """Whether what happens inside region `rec` reaches the monitor through this layer (default: every region;
        the monitor's rules then decide what counts there)."""
        return True

    def layers_skipped(self, skipped: Mapping[str, str]) -> None:
        """Called once installed, with the layers of the selection that cannot run here (layer -> reason)."""
        return None

    def refresh(self) -> None:
        """Called when an outermost region opens: re-install what somebody else may have reset meanwhile."""
        return None

    def region_enter(self, rec: RegionRecord, hot: bool) -> None:
        return None

    def region_exit(self, rec: RegionRecord, hot: bool) -> None:
        return None

    def read_begin(self) -> None:
        return None

    def read_end(self) -> None:
        return None

    def collect(self) -> list[Event]:
        """Events of layers that report after the fact, attributed to regions by id; called when no region is open."""
        return []

    def findings(self) -> list[Finding]:
        """Findings of a layer that folds its own observations (FC204's staging monitor), drained with the rest."""
        return []

    def _emit(self, event: Event) -> None:
        sink = self._sink
        if sink is not None:
            sink.emit(event)

    def _error(self, exc: BaseException) -> None:
        sink = self._sink
        if sink is None:
            raise exc
        sink.hook_error(self.layer, exc)
