"""Pipelined isolated runs: the worker runs a step while the parent draws the next, and every step is still
judged, in order, with the same findings at the same step as an unpipelined run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import faulty_verdicts as fv
import pytest

from flashcheck.fuzzing import stateful
from flashcheck.fuzzing.recorder import FindingLog
from flashcheck.fuzzing.stateful import FuzzFailure, close_sessions, fuzz_target, replay_machine
from flashcheck.isolation import IsolatedDriver
from flashcheck.scenario import Step, StepResult

SMALL = {"max_kv_len": 256, "chunk": 32, "max_pages": 256}
FAULTY = "faulty_targets:PlanInfoVaries"  # FC304 on replay
# No detection layers in the workers: what is compared here is which steps are judged, in which order, and the
# properties' findings (FC304); a worker with layers imports torch's dynamo too (~2 s on 2 CPU cores).
LAYERS = "off"


@pytest.mark.slow
def test_steps_sent_ahead_of_a_fault_run_again_in_the_fresh_worker() -> None:
    """Three steps are sent before the first result is read; the second poisons its worker, so the two behind it
    run in a fresh one, and each result belongs to its own step."""
    steps = fv.FAULT_THEN_GO_ON
    with IsolatedDriver("faulty_verdicts:FaultSurfacesLater", config=fv.SMALL, device="cpu", layers="off") as drv:
        for i, s in enumerate(steps):
            drv.submit(s, i)
        assert drv.in_flight == 4
        results = [drv.collect() for _ in steps]
        assert drv.in_flight == 0
    (fault,) = results[1].findings
    assert fault.id == "FC250"
    assert [r.findings for r in (results[0], results[2], results[3])] == [[], [], []]
    assert all(r.sample is not None for r in (results[0], results[2], results[3]))
    assert drv.restarts == 1


def _run(target: str, *, pipeline: bool, **kw: Any) -> tuple[list[tuple[str, tuple[int, ...]]], Any]:
    seen: list[tuple[str, tuple[int, ...]]] = []

    def record(step: Step, result: StepResult) -> None:
        seen.append((step.op, step.kv_lens))

    failure = None
    try:
        fuzz_target(
            target,
            profile="ci",
            device="cpu",
            database=None,
            isolate=True,
            pipeline=pipeline,
            check=record,
            layers=LAYERS,
            **kw,
        )
    except FuzzFailure as exc:
        failure = exc
    finally:
        close_sessions()
    return seen, failure


@pytest.mark.slow
def test_a_pipelined_run_judges_the_same_steps_as_an_unpipelined_one() -> None:
    kw: dict[str, Any] = {"config": SMALL, "budget": 3, "seed": 2}
    plain, none = _run("cpu-reference", pipeline=False, **kw)
    piped, none_either = _run("cpu-reference", pipeline=True, **kw)
    assert none is None and none_either is None
    assert len(plain) > 10 and piped == plain


@pytest.mark.slow
def test_a_pipelined_run_fails_at_the_same_step_with_the_same_reproducer() -> None:
    kw: dict[str, Any] = {"config": SMALL, "budget": 15, "seed": 5, "shrink_seconds": 0}
    _, plain = _run(FAULTY, pipeline=False, **kw)
    _, piped = _run(FAULTY, pipeline=True, **kw)
    assert plain is not None and piped is not None
    assert [f.id for f in piped.findings] == [f.id for f in plain.findings] == ["FC304"]
    assert piped.records[0].repro["scenario"] == plain.records[0].repro["scenario"]
    assert piped.records[0].repro["step"] == plain.records[0].repro["step"]


@pytest.mark.slow
def test_a_finding_judged_after_an_overrun_is_raised_by_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An example that ends on an overrun can take no failure in Hypothesis: the last step's findings are kept for
    the run to raise; an example that ends normally fails at teardown."""
    machine = replay_machine(
        FAULTY, config=SMALL, device="cpu", layers=LAYERS, isolate=True, pipeline=True, log=FindingLog(tmp_path)
    )
    steps = [Step("capture", (1, 1), (9, 17), bucket=2), Step("replay", (1,), (40,), bucket=2)]
    try:
        for frozen, expect_raise in ((False, True), (True, False)):
            monkeypatch.setattr(stateful, "_frozen", lambda frozen=frozen: frozen)
            machine.unraised = ()
            m = machine()
            assert m.pipelined
            for s in steps:
                m.run_step(s)
            if expect_raise:
                with pytest.raises(FuzzFailure) as info:
                    m.teardown()
                assert [f.id for f in info.value.findings] == ["FC304"]
                assert machine.unraised == ()
            else:
                m.teardown()
                assert [r.finding.id for r in machine.unraised] == ["FC304"]
    finally:
        close_sessions()


def test_a_step_we_are_called_wrong_with_still_leaves_the_result_before_it() -> None:
    """The worker settles a step when the next one is prepared; a next step outside the target's capacity is a
    usage error, and the result of the step before it still comes back."""
    b = 1
    steps = [
        Step("capture", (1,), (8,), bucket=b),
        Step("replay", (1,), (9,), bucket=b, seed=7),
        Step("eager", (1,) * 99, (5,) * 99),  # more requests than the target takes
    ]
    with IsolatedDriver("seed_bugs_cpu:QueryFrozenAtCapture", device="cpu", layers="off") as drv:
        for i, s in enumerate(steps):
            drv.submit(s, i)
        assert drv.collect().findings == []
        assert "FC303" in [f.id for f in drv.collect().findings]
        with pytest.raises(Exception, match="max_batch_size"):
            drv.collect()


@pytest.mark.slow
def test_the_next_step_is_sent_before_the_one_before_it_is_judged(tmp_path: Path) -> None:
    """The worker finds the next step waiting when it finishes one: while a step is judged, the step after it is
    already in flight (the last one, judged when the example ends, has none behind it)."""
    behind: list[int] = []
    machine = replay_machine(
        "cpu-reference",
        config=SMALL,
        device="cpu",
        layers=LAYERS,
        isolate=True,
        pipeline=True,
        log=FindingLog(tmp_path),
        check=lambda step, result: behind.append(m.driver.in_flight),
    )
    steps = [
        Step("capture", (1, 1), (9, 17), bucket=2),
        Step("replay", (1,), (40,), bucket=2),
        Step("eager", (1, 1, 1), (5, 30, 7)),
    ]
    try:
        m = machine()
        for s in steps:
            m.run_step(s)
        m.settle()  # as the example's teardown does
    finally:
        close_sessions()
    assert behind == [1, 1, 0]


@pytest.mark.slow
def test_a_worker_that_died_with_its_step_in_flight_fails_that_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker dies in a replay while Hypothesis draws the next step: the next step is sent to no fresh worker
    before the dead one's step is judged, so the crash is that step's finding and no later step is judged with
    another step's result."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "campaign"))
    judged: list[tuple[str, str | None]] = []
    machine = replay_machine(
        "crashy:ExitOnShape",
        config={"max_kv_len": 96, "max_pages": 64, "max_qo_len": 4},
        device="cpu",
        layers="off",
        isolate=True,
        pipeline=True,
        step_timeout=3.0,
        log=FindingLog(tmp_path),
        check=lambda step, result: judged.append((step.op, result.sample.op if result.sample else None)),
    )
    steps = [
        Step("capture", (1, 1, 1), (10, 17, 5), bucket=4),
        Step("eager", (1, 1), (5, 7)),
        Step("replay", (1, 1, 1), (9, 10, 11), bucket=4),  # the worker exits in prepare_replay
        Step("eager", (1, 1), (6, 8)),
        Step("eager", (1, 1), (4, 8)),
    ]
    try:
        m = machine()
        with pytest.raises(FuzzFailure) as info:
            for s in steps:
                m.run_step(s)
                time.sleep(0.3)  # Hypothesis drawing the next rule meanwhile: the worker is dead by the next send
    finally:
        close_sessions()
    assert judged == [("capture", "capture"), ("eager", "eager")]
    (record,) = info.value.records
    assert record.finding.id == "FC251" and record.finding.location.step == 2
