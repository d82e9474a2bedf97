"""A verdict is a promise: a run names a check as passed only where it exercised it. For every path a run takes (a
session in this process, an isolated worker, the Hypothesis machine behind ``flashcheck fuzz``, a static run; the
campaign worker's pair is in ``tests/campaign/test_numbers.py``), a check that ran is reported passed and one that was
selected and never reached is not."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from flashcheck.cli import EXIT_CLEAN, EXIT_INCOMPLETE, main
from flashcheck.driver import checks_run
from flashcheck.exercised import Exercised, add_exercised, read_checks_by_target
from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.isolation import IsolatedDriver
from flashcheck.reports import build_view, render
from flashcheck.reports.model import CheckStatus
from flashcheck.rundir import RunResult
from flashcheck.scenario import Step
from flashcheck.session import open_session
from flashcheck.targets.reference import ReferenceTarget

QUALITY = Path(__file__).resolve().parents[1] / "quality"
sys.path.insert(0, str(QUALITY))
import faulty_verdicts as fv  # noqa: E402

CAPTURES = [Step("capture", (1,) * b, (9,) * b, bucket=b) for b in (1, 2, 4, 8)]
REPLAY = Step("replay", (1, 1, 1), (9, 17, 33), bucket=4)
EAGER = Step("eager", (2, 1), (30, 12))


def _statuses(checks: list[str], target: str, ex: Exercised, findings: Any = ()) -> dict[str, CheckStatus]:
    meta = {"kind": "fuzz", "target": target, "targets": [target], "checks": checks, "finished": 1.0}
    add_exercised(meta, {target: ex})
    view = build_view(RunResult(meta, list(findings)))
    return {r.id: r.status for r in view.check_results()}


def _run(target: ReferenceTarget, steps: list[Step], **kw: Any) -> Exercised:
    with open_session(target, device="cpu", seed=1, **kw) as drv:
        for i, s in enumerate(steps):
            assert drv.execute(s, i).findings == []
        return drv.exercised()


# ---- the model --------------------------------------------------------------------------------------------------
def test_records_merge_across_sessions_and_round_trip_through_run_json() -> None:
    a = Exercised({"FC301"}, {"FC202": "no CUDA device", "FC304": "no buckets"})
    b = Exercised({"FC304"})
    merged = a.merged(b)
    assert merged.exercised == {"FC301", "FC304"} and merged.not_applicable == {"FC202": "no CUDA device"}
    assert Exercised.from_dict(json.loads(json.dumps(merged.to_dict()))) == merged
    meta: dict[str, Any] = {}
    add_exercised(meta, {"t": a})
    add_exercised(meta, {"t": b, "u": Exercised({"FC250"})})  # a later session, another target
    records = read_checks_by_target(meta)
    assert records is not None and records["t"] == merged and records["u"].exercised == {"FC250"}
    assert read_checks_by_target({}) is None  # a run written before the record


# ---- a session in this process ----------------------------------------------------------------------------------
def test_a_session_that_reaches_every_phase_exercises_every_selected_check_and_reports_them_passed() -> None:
    ex = _run(
        ReferenceTarget(**fv.SMALL), random_steps(ReferenceTarget(**fv.SMALL).capacity, 30, seed=5), step_timeout=30
    )
    selected = checks_run("all", watchdog=True)
    # on the CPU no layer that sees allocations runs: FC202 cannot apply here, and says why
    assert set(selected) & set(ex.not_applicable) == {"FC202"}
    assert "skipped here: cupti, gpu_trace, sync_debug" in ex.not_applicable["FC202"]
    assert set(selected) - ex.exercised == {"FC202"}
    status = _statuses(selected, "cpu-reference", ex)
    assert status.pop("FC202") is CheckStatus.NOT_APPLICABLE and set(status.values()) == {CheckStatus.PASSED}


def test_a_session_that_only_captures_never_reports_the_output_and_replay_checks_passed() -> None:
    ex = _run(ReferenceTarget(**fv.SMALL), CAPTURES, layers="off")
    selected = checks_run("off", watchdog=False)
    assert {"FC250", "FC301", "FC302"} <= ex.exercised  # FC301 checks every capture's plan; the arena scans it
    missed = {"FC303", "FC304", "FC305"}
    assert not missed & ex.exercised and not missed & set(ex.not_applicable)
    status = _statuses(selected, "cpu-reference", ex)
    assert {c for c, s in status.items() if s is CheckStatus.NOT_EXERCISED} == missed
    assert not {c for c, s in status.items() if s is CheckStatus.PASSED} & missed


def test_a_check_that_cannot_apply_to_the_target_is_not_applicable_not_missing() -> None:
    eager_only = ReferenceTarget(**{**fv.SMALL, "buckets": ()})
    ex = _run(eager_only, [EAGER, EAGER], layers="off")
    assert "no buckets" in ex.not_applicable["FC304"] and "FC304" not in ex.exercised  # it checks a replay
    assert {"FC301", "FC303", "FC305"} <= ex.exercised  # FC301 also checks every plan, FC303 every output
    status = _statuses(checks_run("off", watchdog=False), "cpu-reference", ex)
    assert status["FC304"] is CheckStatus.NOT_APPLICABLE and CheckStatus.NOT_EXERCISED not in status.values()


def test_the_watchdog_counts_only_when_a_step_ran_under_it() -> None:
    assert "FC252" in _run(ReferenceTarget(**fv.SMALL), [EAGER], layers="off", step_timeout=30).exercised
    assert "FC252" not in _run(ReferenceTarget(**fv.SMALL), [EAGER], layers="off", step_timeout=None).exercised
    with open_session(ReferenceTarget(**fv.SMALL), device="cpu", layers="off", step_timeout=30) as drv:
        assert "FC252" not in drv.exercised().exercised  # set up, but no step ran yet
        assert "FC250" in drv.exercised().exercised  # the target was called (its setup)


def test_a_runtime_detector_counts_only_where_an_active_layer_watched_its_region() -> None:
    t = ReferenceTarget(**fv.SMALL)
    with open_session(t, device="cpu", seed=1, layers="all") as drv:
        assert not {"FC201", "FC203"} & drv.exercised().exercised  # only the setup region opened
        drv.execute(CAPTURES[0], 0)
        assert "FC203" in drv.exercised().exercised and "FC201" not in drv.exercised().exercised
        drv.execute(EAGER, 1)  # plan and run are hot: dispatch watches them here (CUPTI cannot run on the CPU)
        assert {"FC201", "FC203"} <= drv.exercised().exercised
    # the cheap layers leave hot regions to CUPTI and sync debug, which need a device: FC201 cannot apply here
    ex = _run(t, [CAPTURES[0], EAGER], layers="cheap")
    assert "FC203" in ex.exercised and "FC201" not in ex.exercised and "FC201" in ex.not_applicable
    assert "skipped here: gpu_trace, sync_debug" in ex.not_applicable["FC201"]


# ---- an isolated worker -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_an_isolated_worker_reports_what_it_exercised_and_a_replay_check_passes_only_after_a_replay() -> None:
    selected = checks_run("off", watchdog=True)
    with IsolatedDriver("cpu-reference", config=fv.SMALL, device="cpu", layers="off", step_timeout=30.0) as drv:
        assert not drv.exercised()  # no worker yet
        for i, s in enumerate(CAPTURES):
            assert drv.execute(s, i).findings == []
        before = drv.exercised()
        assert {"FC250", "FC252", "FC301", "FC302"} <= before.exercised and "FC304" not in before.exercised
        assert _statuses(selected, "cpu-reference", before)["FC304"] is CheckStatus.NOT_EXERCISED
        assert drv.execute(REPLAY, 4).findings == []
        after = drv.exercised()
    assert {"FC303", "FC304", "FC305"} <= after.exercised
    assert set(_statuses(selected, "cpu-reference", after).values()) == {CheckStatus.PASSED}


# ---- the Hypothesis machine behind flashcheck fuzz ----------------------------------------------------------------
def _fuzz(out: Path, target: str, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.syspath_prepend(str(QUALITY))
    monkeypatch.chdir(out.parent)  # a fresh example database: examples saved by earlier runs would change the draw
    return main([
        "fuzz", "--target", target, "--config", json.dumps(fv.SMALL), "--examples", "3", "--profile", "ci",
        "--device", "cpu", "--layers", "off", "--seed", "4", "--out", str(out),
    ])  # fmt: skip


def test_a_fuzz_run_records_per_target_what_it_exercised_and_passes_those(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert _fuzz(out, "cpu-reference", monkeypatch) == EXIT_CLEAN
    meta = json.loads((out / "run.json").read_text())
    assert set(meta["checks"]) <= set(meta["checks_by_target"]["cpu-reference"]["exercised"])
    capsys.readouterr()
    assert main(["report", str(out), "--format", "junit"]) == EXIT_CLEAN
    suite = ET.fromstring(capsys.readouterr().out)
    assert suite.find("testsuite").get("skipped") == "0"  # type: ignore[union-attr]
    assert len(list(suite.iter("testcase"))) == len(meta["checks"])


def test_a_fuzz_run_that_never_reaches_its_checks_is_incomplete_never_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert _fuzz(out, "faulty_verdicts:RejectsEveryInput", monkeypatch) == EXIT_INCOMPLETE
    assert "FC301" in capsys.readouterr().out.split("not exercised: ")[1]
    record = json.loads((out / "run.json").read_text())["checks_by_target"]["rejects-every-input"]
    assert record["exercised"] == ["FC250"]  # the target was set up; every step was outside its contract
    assert main(["report", str(out), "--format", "json"]) == EXIT_INCOMPLETE
    doc = json.loads(capsys.readouterr().out)
    status = {c["id"]: c["status"] for c in doc["checks"]}
    assert status["FC250"] == "passed" and status["FC301"] == status["FC305"] == "not exercised"
    assert doc["summary"]["verdict"] == "incomplete"


# ---- a static run -------------------------------------------------------------------------------------------------
def test_a_static_run_exercises_every_rule_it_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "clean.py"
    src.write_text("def f(x):\n    return x + 1\n")
    run_dir = tmp_path / "static-run"
    assert main(["static", str(src), "--run-dir", str(run_dir)]) == EXIT_CLEAN
    capsys.readouterr()
    assert main(["report", str(run_dir), "--format", "concise"]) == EXIT_CLEAN
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("OK: no findings; checks run and passed: FC1") and "did not record" not in line
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["checks_by_target"]["static"]["exercised"] == meta["checks"]
    view = build_view(RunResult(meta, []))
    assert {r.status for r in view.check_results()} == {CheckStatus.PASSED}
    assert "not exercised" not in render(view, "junit")
