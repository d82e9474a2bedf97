"""A time budget stops a fuzz run about one example after it is spent; documented upstream behaviours
(`flashcheck.known`) are counted, not failures, while everything else still fails the run."""

from __future__ import annotations

import functools
import itertools
import types
from typing import Any

import faulty_targets
import pytest

from flashcheck.fuzzing import stateful
from flashcheck.fuzzing.stateful import FuzzFailure, close_sessions, fuzz_target
from flashcheck.known import KnownBehaviour, split_known
from tests.conftest import PLANTED_BUG_LAYERS

SMALL = {"max_kv_len": 256, "chunk": 32, "max_pages": 256}


def _fake_runs(monkeypatch: pytest.MonkeyPatch, per_example: float) -> list[int]:
    """Replace Hypothesis' runner and the clock: each round 'takes' examples * per_example seconds."""
    clock = [0.0]
    asked: list[int] = []

    def fake_run(machine: Any, settings: Any) -> None:
        asked.append(int(settings.max_examples))
        clock[0] += settings.max_examples * per_example

    monkeypatch.setattr(stateful, "run_state_machine_as_test", fake_run)
    monkeypatch.setattr(stateful.time, "monotonic", lambda: clock[0])
    return asked


def test_time_budget_sizes_rounds_from_the_measured_time_per_example(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _fake_runs(monkeypatch, per_example=0.5)
    report = fuzz_target("cpu-reference", config=SMALL, budget="10s", profile="ci", device="cpu", database=None)
    # 3 examples measure 1.5 s; the 8.5 s left hold 17 more; then the budget is spent
    assert asked == [stateful._FIRST_ROUND, 17]
    assert report.rounds == 2


def test_time_budget_never_asks_more_than_the_profile_per_round(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _fake_runs(monkeypatch, per_example=0.01)
    fuzz_target("cpu-reference", config=SMALL, budget="1s", profile="ci", device="cpu", database=None)
    assert asked[0] == stateful._FIRST_ROUND and max(asked) == 20  # the ci profile's examples
    assert sum(asked) * 0.01 >= 1.0


def test_example_budget_is_one_round(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _fake_runs(monkeypatch, per_example=100.0)
    fuzz_target("cpu-reference", config=SMALL, budget=7, profile="ci", device="cpu", database=None)
    assert asked == [7]


TARGET = "faulty_targets:PlanInfoVaries"  # FC304 on replay


@pytest.mark.slow
def test_a_known_upstream_behaviour_does_not_fail_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = KnownBehaviour(check="FC304", targets="*", where="", reason="test: documented upstream behaviour")
    monkeypatch.setattr(stateful, "split_known", functools.partial(split_known, known=[entry]))
    seen: list[str] = []

    def record(step: Any, result: Any) -> None:
        seen.extend(f.id for f in result.findings)

    try:
        fuzz_target(TARGET, config=SMALL, budget=15, seed=5, profile="ci", device="cpu", database=None, check=record)
    finally:
        close_sessions()
    assert "FC304" in seen  # the finding happened, and the run still passed


def test_the_same_finding_fails_the_run_when_it_is_not_known(monkeypatch: pytest.MonkeyPatch) -> None:
    other = KnownBehaviour(check="FC201", targets="*", where="", reason="test: another check")
    monkeypatch.setattr(stateful, "split_known", functools.partial(split_known, known=[other]))
    try:
        with pytest.raises(FuzzFailure) as info:
            # the first failing example ends the run (shrink_seconds=0): shrinking it is the next test's
            fuzz_target(
                TARGET, config=SMALL, budget=15, seed=5, profile="ci", device="cpu", database=None, shrink_seconds=0
            )
    finally:
        close_sessions()
    assert {f.id for f in info.value.findings} == {"FC304"}


@pytest.mark.slow
def test_shrinking_stops_at_its_time_limit_with_the_smallest_failure_so_far() -> None:
    """With `shrink_seconds=0` the run ends at the first failing example (as a GPU run does once shrinking a
    faulting step has used its time), still as a FuzzFailure with its reproducer; with no limit it is shrunk."""
    kw: dict[str, Any] = {"config": SMALL, "budget": 15, "seed": 5, "profile": "ci", "device": "cpu"}
    kw["layers"] = PLANTED_BUG_LAYERS
    try:
        with pytest.raises(FuzzFailure) as stopped:
            fuzz_target(TARGET, database=None, shrink_seconds=0, **kw)
        with pytest.raises(FuzzFailure) as shrunk:
            fuzz_target(TARGET, database=None, shrink_seconds=None, **kw)
    finally:
        close_sessions()
    assert "shrinking stopped after" in str(stopped.value)
    assert "shrinking stopped" not in str(shrunk.value)
    assert {f.id for f in stopped.value.findings} == {f.id for f in shrunk.value.findings} == {"FC304"}
    first = stopped.value.records[0].repro["scenario"]["steps"]
    smallest = shrunk.value.records[0].repro["scenario"]["steps"]
    assert len(smallest) <= len(first)
    path = stopped.value.records[0].path
    assert path is not None and path.is_file()


def test_shrinking_that_runs_out_of_time_ends_with_the_smallest_failure_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit met in the middle of shrinking ends the run at the next failing example, as a FuzzFailure with its
    reproducer (never as Hypothesis' inconsistent-data error for an example stopped before its first step)."""
    ticks = itertools.count()  # a clock that advances one second each time the run reads it
    monkeypatch.setattr(stateful, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks))))
    kw: dict[str, Any] = {"budget": 30, "seed": 3, "profile": "ci", "device": "cpu", "reset": "session"}
    with pytest.raises(FuzzFailure) as info:
        fuzz_target(faulty_targets.PlanInfoVaries(**SMALL), database=None, shrink_seconds=3.5, **kw)
    assert "shrinking stopped after" in str(info.value)
    assert {f.id for f in info.value.findings} == {"FC304"}
    path = info.value.records[0].path
    assert path is not None and path.is_file()
