"""When a property runs: the phases of a driver step, what each phase observes, and the `Property` declaration.

A property module defines its `Check` and one `Property` per phase it runs in; `flashcheck.catalogue` lists the
module, and the driver runs every listed property of a phase on that phase's observation, in catalogue order. No
torch here: observations hold whatever the target returned (tensors on any device, or host arrays).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from flashcheck.check import Check
from flashcheck.findings import Finding, Location
from flashcheck.layout import PagedLayout

if TYPE_CHECKING:
    from flashcheck.properties.csr import CsrInput

__all__ = ["AfterPlan", "BeforeReplay", "Compare", "OnOutput", "Phase", "Property"]


class Phase(enum.Enum):
    """The points of a step at which the driver runs properties."""

    AFTER_PLAN = "after-plan"  # `AfterPlan`: the metadata an eager step or a capture planned with
    BEFORE_REPLAY = "before-replay"  # `BeforeReplay`: what a graph reads, after prepare_replay, before replay
    ON_OUTPUT = "on-output"  # `OnOutput`: every output run or replay returned
    COMPARE = "compare"  # `Compare`: two outputs whose real rows must agree


@dataclass(frozen=True)
class AfterPlan:
    """The layout the target was planned with (eager steps after `run`, captures after `capture`)."""

    layout: PagedLayout
    location: Location


@dataclass(frozen=True)
class BeforeReplay:
    """A graph bucket after ``prepare_replay``: its persistent metadata buffers (None: the target exposes none) and
    its plan_info now and at capture (None: not exposed). Read inside the checker's own read."""

    bucket: int
    metadata: CsrInput | None
    captured_plan_info: Sequence[int] | None
    plan_info: Sequence[int] | None
    location: Location


@dataclass(frozen=True)
class OnOutput:
    """What ``run`` (``what="eager"``) or ``replay`` returned for a batch of `layout`; `device` is the KV cache's."""

    out: Any
    layout: PagedLayout
    what: Literal["eager", "replay"]
    device: str
    location: Location


@dataclass(frozen=True)
class Compare:
    """Two outputs for the batch of `layout` whose real rows must agree: `what` names them (``"replay vs eager"``,
    ``"eager vs reference"``); each is a tensor on any device or a host array."""

    got: Any
    want: Any
    what: str
    layout: PagedLayout
    location: Location


Obs = TypeVar("Obs")


@dataclass(frozen=True)
class Property(Generic[Obs]):
    """`check` runs `run` on the observation of `phase` (the class named beside each `Phase` member).

    `blocks`: a finding means the rest of the step must not use what was observed: before replay, the graph is not
    replayed (the kernel could fault on the metadata); on an output, it is not compared (it is not an attention
    output of this batch).

    `screen`: the same test evaluated on the device, without a host transfer: a 0-d bool tensor that is true when
    `run` may find something, or None when it cannot screen this observation. The driver reads the screens of a
    step in its one transfer, together with the arena scan, while the host prepares the next step, and runs `run`
    only where a screen is set (or None).
    """

    check: Check
    phase: Phase
    run: Callable[[Obs], list[Finding]]
    blocks: bool = False
    screen: Callable[[Obs], Any] | None = None
