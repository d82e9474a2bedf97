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
