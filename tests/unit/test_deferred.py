"""A submitted step settles while the next one is prepared (`Driver.submit`, `flashcheck.deferred`): the results
are `execute`'s, in step order, each with its own step's findings; a fault met while settling is the settled
step's, and the step after it does not run."""

from __future__ import annotations

from typing import Any

import pytest

from flashcheck.deferred import Transfer
from flashcheck.errors import InvalidArgument
from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.scenario import Step, StepResult
from flashcheck.session import open_session
from flashcheck.targets.reference import ReferenceTarget
from tests.quality.faulty_verdicts import VERDICT_TARGETS
from tests.quality.seed_bugs_cpu import CPU_SEED_BUGS

# every CPU target that runs to the end without a watchdog: clean, each seed bug, each verdict target but the hang
TARGETS: dict[str, Any] = {
    "clean": ReferenceTarget,
    **CPU_SEED_BUGS,
    **{k: v for k, v in VERDICT_TARGETS.items() if "FC252" not in v.intended},
}


def summary(index: int, r: StepResult) -> tuple[Any, ...]:
    sample = r.sample.to_dict() if r.sample else None
    if sample is not None:
        sample.pop("t")
    found = sorted((f.id, f.location.step, f.location.region, f.message) for f in r.findings)
    return index, found, sample, r.rejected


def executed(cls: Any, steps: list[Step]) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    out = []
    with open_session(cls(), device="cpu", layers="cheap", seed=1) as drv:
        for i, s in enumerate(steps):
            out.append(summary(i, drv.execute(s, i)))
            if drv.poisoned:
                break
        return out, drv.exercised().to_dict()


def submitted(cls: Any, steps: list[Step]) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    out = []
    with open_session(cls(), device="cpu", layers="cheap", seed=1) as drv:
        for i, s in enumerate(steps):
            out += [summary(j, r) for j, r in drv.submit(s, i)]
            if drv.poisoned:
                break
        out += [summary(j, r) for j, r in drv.finish()]
        return out, drv.exercised().to_dict()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_submitted_steps_give_what_executed_steps_give(name: str) -> None:
    cls = TARGETS[name]
    steps = random_steps(cls().capacity, 30, seed=5)
    want, want_checks = executed(cls, steps)
    got, got_checks = submitted(cls, steps)
    assert got == want
    assert got_checks == want_checks
    if name in CPU_SEED_BUGS:  # the equality is not vacuous: the seed bugs are found
        assert any(cls.intended in [f[0] for f in found] for _, found, _, _ in want), name


def test_a_result_comes_with_the_next_submit_in_order_and_finish_returns_the_last() -> None:
    t = ReferenceTarget()
    steps = random_steps(t.capacity, 6, seed=3)
    with open_session(t, device="cpu", layers="off", seed=1) as drv:
        assert drv.pending_ready()  # nothing submitted
        assert drv.submit(steps[0], 0) == []
        got = [i for s in range(1, 6) for i, _ in drv.submit(steps[s], s)]
        assert got == [0, 1, 2, 3, 4]
        with pytest.raises(InvalidArgument, match="call finish"):
            drv.execute(steps[0], 9)
        with pytest.raises(InvalidArgument, match="call finish"):
            drv.reset_example()
        assert [i for i, _ in drv.finish()] == [5]
        assert drv.finish() == []
        assert drv.execute(steps[0], 6).sample is not None  # nothing pending: execute runs again


def test_a_replay_that_disagrees_is_explained_by_an_eager_run_when_it_settles() -> None:
    """The screen of a replay is read when the next step is submitted; the eager run that explains a disagreement
    runs then, before any target call of the next step, and its finding is the replay's step's."""
    calls: list[str] = []

    class Recorded(CPU_SEED_BUGS["query-frozen-at-capture"]):  # type: ignore[misc]
        def plan(self, layout: Any) -> None:
            calls.append("plan")
            super().plan(layout)

        def run(self, q: Any) -> Any:
            calls.append("run")
            return super().run(q)

        def prepare_replay(self, bucket: int, layout: Any) -> None:
            calls.append("prepare_replay")
            super().prepare_replay(bucket, layout)

    t = Recorded()
    b = t.capacity.buckets[0]
    capture = Step("capture", (1,), (8,), bucket=b)
    replay = Step("replay", (1,), (9,), bucket=b, seed=7)
    nxt = Step("eager", (1,), (5,))
    with open_session(t, device="cpu", layers="off", seed=1) as drv:
        drv.submit(capture, 0)
        drv.submit(replay, 1)
        calls.clear()
        (i, r), *_ = [d for d in drv.submit(nxt, 2) if d[0] == 1]
        assert i == 1
        msgs = [f.message for f in r.findings if f.id == "FC303"]
        assert msgs and all(f.location.step == 1 for f in r.findings), r.findings
        assert any("replay vs eager" in m for m in msgs), msgs
        assert calls[:2] == ["plan", "run"] and calls[2:] == ["plan", "run"]  # the eager check, then step 2
        assert [j for j, _ in drv.finish()] == [2]


def test_a_fault_met_while_settling_is_the_settled_steps_and_the_next_step_does_not_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = ReferenceTarget()
    steps = random_steps(t.capacity, 4, seed=3)
    with open_session(t, device="cpu", layers="off", seed=1) as drv:
        drv.submit(steps[0], 0)
        drv.submit(steps[1], 1)

        def faulted(self: Transfer) -> list[list[int]]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        monkeypatch.setattr(Transfer, "read", faulted)
        done = drv.submit(steps[2], 2)
        assert drv.poisoned and [i for i, _ in done] == [1]
        (f,) = done[0][1].findings
        assert f.id == "FC250" and f.location.step == 1 and "flashcheck's own reads" in f.message
        assert f.location.region in {"run", "replay", "capture"}  # the settled step's last target region
        assert drv.finish() == []  # step 2 never ran


def test_a_transfer_reads_each_tensor_in_order() -> None:
    torch = pytest.importorskip("torch")
    t = Transfer(torch, [torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor(True), torch.tensor(False)])
    assert t.ready()
    assert t.read() == [[1, 2, 3, 4, 5, 6], [1], [0]]


def test_prepare_settles_the_step_before_without_running_the_next_one_and_launch_runs_it() -> None:
    """Workers send a step's result once the next one is prepared, before it runs: a slow next step (a JIT compile)
    never holds back the result of the one before."""
    calls: list[str] = []

    class Counted(ReferenceTarget):
        def plan(self, layout: Any) -> None:
            calls.append("plan")
            super().plan(layout)

    t = Counted()
    eager = Step("eager", (1,), (5,))
    with open_session(t, device="cpu", layers="off", seed=1) as drv:
        assert drv.prepare(eager, 0) == [] and calls == []
        drv.launch()
        assert calls == ["plan"]
        assert [i for i, _ in drv.prepare(eager, 1)] == [0] and calls == ["plan"]
        with pytest.raises(InvalidArgument, match="call launch"):
            drv.prepare(eager, 2)
        with pytest.raises(InvalidArgument, match="call launch"):
            drv.finish()
        drv.launch()
        assert calls == ["plan", "plan"]
        assert [i for i, _ in drv.finish()] == [1]
        drv.launch()  # nothing prepared: nothing runs
        assert calls == ["plan", "plan"]


class ScalesQueriesInPlace(ReferenceTarget):
    """Scales the queries it is given in place before attending: its output disagrees with attention over the
    queries it was given."""

    def run(self, q: Any) -> Any:
        q.mul_(2.0)
        return super().run(q)


@pytest.mark.parametrize("mode", ["execute", "submit"])
def test_the_reference_reads_the_queries_as_they_were_before_the_target_ran(mode: str) -> None:
    step = Step("eager", (3,), (40,))
    with open_session(ScalesQueriesInPlace(), device="cpu", layers="off", seed=1) as drv:
        if mode == "execute":
            found = drv.execute(step, 0).findings
        else:
            found = [f for _, r in drv.submit(step, 0) + drv.finish() for f in r.findings]
    assert [f.id for f in found] == ["FC303"] and "eager vs reference" in found[0].message


def test_a_fault_that_surfaces_when_asking_whether_the_transfer_is_done_is_the_settled_steps() -> None:
    """On CUDA a fault of the step's own device work surfaces on the next CUDA call, which may be the event query
    of `Transfer.ready`: the worker's idle loop asks it, and `finish` asks it before reading. The event here is one
    whose query and synchronize raise the fault, as a CUDA event does in a poisoned context."""
    t = ReferenceTarget()
    steps = random_steps(t.capacity, 3, seed=3)

    class FaultedEvent:
        def query(self) -> bool:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        synchronize = query

    with open_session(t, device="cpu", layers="off", seed=1) as drv:
        drv.submit(steps[0], 0)
        drv.submit(steps[1], 1)
        assert drv._pending is not None and drv._pending.transfer is not None
        drv._pending.transfer._event = FaultedEvent()
        assert drv.pending_ready() is False  # asking does not raise
        (i, r), *rest = drv.finish()
        assert i == 1 and rest == [] and drv.poisoned
        assert [f.id for f in r.findings] == ["FC250"] and r.findings[0].location.step == 1


def test_a_step_whose_transfer_never_completes_is_settled_under_the_watchdog_after_half_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = ReferenceTarget()
    with open_session(t, device="cpu", layers="off", seed=1, step_timeout=30.0) as drv:
        drv.submit(Step("eager", (1,), (5,)), 0)
        monkeypatch.setattr(Transfer, "ready", lambda self: False)
        assert drv.pending_ready() is False
        assert drv._pending is not None
        drv._pending.launched -= 16.0  # more than half the timeout ago
        assert drv.pending_ready() is True
        assert [i for i, _ in drv.finish()] == [0]


def test_the_launch_and_the_settling_of_a_step_share_one_step_timeout() -> None:
    """A replay's prepare_replay and the eager run that explains its disagreement each take 0.6 timeouts: the step
    took 1.2 and is FC252, as it was when both ran in one phase."""
    import time

    calls: list[str] = []

    class Slow(CPU_SEED_BUGS["query-frozen-at-capture"]):  # type: ignore[misc]
        def prepare_replay(self, bucket: int, layout: Any) -> None:
            calls.append("prepare_replay")
            time.sleep(0.6)
            super().prepare_replay(bucket, layout)

        def plan(self, layout: Any) -> None:
            if calls:  # the explaining eager run, at settling
                time.sleep(0.6)
            super().plan(layout)

    t = Slow()
    b = t.capacity.buckets[0]
    with open_session(t, device="cpu", layers="off", seed=1, step_timeout=1.0, warm_up_scale=1.0) as drv:
        drv.execute(Step("capture", (1,), (8,), bucket=b), 0)
        r = drv.execute(Step("replay", (1,), (9,), bucket=b, seed=7), 1)
    assert "FC252" in [f.id for f in r.findings], r.findings
