"""Which runtime detectors a checker exercised: a region opened at a place where an active layer reports events their
rules apply to. The monitor remembers each distinct place; the hooks say what they report and where they watch."""

from __future__ import annotations

from typing import ClassVar

from flashcheck.runtime import Checker
from flashcheck.runtime.hooks.base import EventSink, Hook
from flashcheck.runtime.monitor import Event, Monitor, RegionRecord


class _Allocations(Hook):
    """Reports device allocations anywhere (as gpu_trace does), installed without torch."""

    layer = "gpu_trace"
    reports: ClassVar[tuple[Event, ...]] = (Event("alloc", "gpu_trace"),)

    def _install(self, sink: EventSink) -> None:
        return None

    def _uninstall(self) -> None:
        return None


class _CaptureCopies(_Allocations):
    """Reports pinned copies, inside capture regions only (as the capture-scoped dispatch layer does)."""

    layer = "dispatch"
    reports: ClassVar[tuple[Event, ...]] = (Event("d2h_copy", "dispatch", memory="pinned"),)

    def watches(self, rec: RegionRecord) -> bool:
        return "capture" in rec.names()


class _Silent(_Allocations):
    layer = "graph_replay"
    reports: ClassVar[tuple[Event, ...]] = ()


def test_the_monitor_remembers_each_distinct_place_a_region_opened() -> None:
    mon = Monitor(cold_regions=("plan",))
    for _ in range(3):
        mon.exit(mon.enter("replay"))
    outer = mon.enter("capture")
    mon.exit(mon.enter("plan"))
    mon.exit(outer)
    assert [(r.enclosing, r.name) for r in mon.places()] == [((), "replay"), ((), "capture"), (("capture",), "plan")]
    assert mon.probe("replay").graph_hot == "replay" and mon.probe("plan").hot is None  # cold here
    assert mon.places()[0].hot == "replay"


def test_a_detector_is_exercised_only_once_its_region_opened_under_a_layer_that_reports_its_events() -> None:
    with Checker(layers=[_Allocations(), _CaptureCopies(), _Silent()]) as chk:
        assert chk.applicable() == {"FC202", "FC203"} and chk.exercised() == frozenset()
        with chk.region("run"):  # eager: allocations do not count there, nothing is exercised
            pass
        assert chk.exercised() == frozenset()
        with chk.region("capture"):
            pass
        assert chk.exercised() == {"FC203"}
        with chk.region("replay"):
            pass
        assert chk.exercised() == {"FC202", "FC203"}
    assert chk.exercised() == {"FC202", "FC203"}  # what it was at exit


def test_a_layer_that_reports_nothing_makes_no_detector_applicable() -> None:
    with Checker(layers=[_Silent()]) as chk:
        with chk.region("replay"), chk.region("capture"):
            pass
        assert chk.applicable() == frozenset() and chk.exercised() == frozenset()


def test_a_region_the_target_declares_cold_exercises_nothing_there() -> None:
    with Checker(layers=[_Allocations()], cold_regions=("prepare_replay", "replay")) as chk:
        with chk.region("replay"):
            pass
        assert chk.exercised() == frozenset() and chk.applicable() == frozenset()
