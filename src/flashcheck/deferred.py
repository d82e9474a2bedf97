"""The part of a driver step that is read after its launches: the arena scan and the device screens of the
outputs' comparisons, brought to the host in one transfer.

A step launches its target's work, then the reductions that judge it (`Arena.probe`, each `Property.screen`), and
queues one non-blocking copy of all their results into page-locked memory behind a CUDA event. The driver reads it
when the step *settles*: at once for `Driver.execute`, or, for `Driver.prepare`/`submit`, when the next step has
done its host preparation (batch, layout), so that the host prepares step i+1 while the device finishes step i. Nothing
of step i+1 that can overwrite what step i left to read (the reference's graph output, the target's outputs, the
workspaces) runs before step i settled, and what settling finds is step i's, at step i. Without CUDA the copy is
synchronous and the order of events is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flashcheck.batch import BatchSpec
from flashcheck.findings import Finding, Location
from flashcheck.properties.phases import Compare
from flashcheck.runtime.api import Region
from flashcheck.runtime.arena import ArenaProbe

__all__ = ["Pending", "Screened", "Transfer"]


@dataclass
class Screened:
    """The comparison properties of one `Compare` observation, waiting for their screens (`flags`, one per
    property of the phase: a 0-d device bool, or None where the property cannot screen it and must run). `then`
    turns what they found into the step's findings (a replay that disagrees with the reference is explained by an
    eager run); None keeps them."""

    obs: Compare
    flags: list[Any]
    then: Callable[[list[Finding]], list[Finding]] | None = None


@dataclass
class Pending:
    """A step whose launches are done and whose device-side checks are not read yet."""

    index: int
    name: str
    label: str
    warm: bool
    loc: Location
    op: str
    spec: BatchSpec
    padded: int
    findings: list[Finding]
    last_region: tuple[Region, str] | None
    probe: ArenaProbe | None = None
    screens: list[Screened] = field(default_factory=list)
    transfer: Transfer | None = None
    usage: dict[str, tuple[int, int]] = field(default_factory=dict)
    values: list[list[int]] | None = None  # the transfer's values, once read
    spent: float = 0.0  # seconds the step spent under its watchdog so far (its phases share one step timeout)
    launched: float = 0.0  # `time.monotonic()` when its launch ended


class Transfer:
    """Integer and bool tensors brought to the host in one copy. On one CUDA device: concatenated there, copied
    without blocking into page-locked memory, and an event recorded behind the copy; `ready` asks the event and
    `read` waits for it. Otherwise each tensor is copied when it is read."""

    def __init__(self, torch: Any, tensors: list[Any]) -> None:
        self._torch = torch
        self._sizes = [int(t.numel()) for t in tensors]
        self._tensors: list[Any] = tensors
        self._host: Any = None
        self._event: Any = None
        devices = {str(t.device) for t in tensors}
        if len(devices) == 1 and next(iter(devices)).startswith("cuda"):
            joined = torch.cat([t.reshape(-1).to(torch.int64) for t in tensors])
            self._host = joined.to("cpu", non_blocking=True)  # page-locked: the copy does not block
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(joined.device))
            self._tensors = []

    def ready(self) -> bool:
        """Whether `read` would return without waiting for the device. False when asking raises (a fault of the
        device work before it): `read` then raises it, where the driver attributes it to the step."""
        if self._event is None:
            return not self.blocking
        try:
            return bool(self._event.query())
        except Exception:
            return False

    @property
    def blocking(self) -> bool:
        """Whether `read` may wait for a device: CUDA tensors copied without an event (tensors of several devices)."""
        return self._event is None and any(str(t.device).startswith("cuda") for t in self._tensors)

    def read(self) -> list[list[int]]:
        """Each tensor's values, flattened, in the order given."""
        if self._event is not None:
            if not self._event.query():  # asking is cheaper than waiting when the copy has completed
                self._event.synchronize()
            flat: list[int] = self._host.tolist()
        else:
            flat = [int(v) for t in self._tensors for v in t.reshape(-1).cpu().tolist()]
        out, at = [], 0
        for n in self._sizes:
            out.append(flat[at : at + n])
            at += n
        return out
