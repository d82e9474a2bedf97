"""Which checks a report says ran: every selected check on every target that ran (none on a target a campaign dropped
as unable to run here), passed only where the run exercised it (``run.json`` ``"checks_by_target"``), never where it
was selected and not exercised; runs written before the record existed read as they did."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from flashcheck.findings import Finding, Location
from flashcheck.reports import build_view, render
from flashcheck.reports.model import CheckStatus
from flashcheck.rundir import RunResult

META = {
    "kind": "campaign",
    "target": "crashy:Mixed,cpu-reference",
    "targets": ["crashy-mixed", "cpu-reference"],
    "checks": ["FC301", "FC302"],
    "campaign": {"dropped_targets": {"crashy:Mixed": "no GPU"}, "stop_reason": "step budget spent"},
    "started": 0.0,
    "finished": 1.0,
}

FUZZ: dict[str, Any] = {
    "kind": "fuzz",
    "target": "cpu-reference",
    "targets": ["cpu-reference"],
    "checks": ["FC202", "FC250", "FC301", "FC304"],
    "started": 0.0,
    "finished": 1.0,
}


def _view(meta: dict[str, Any], findings: list[Finding] | None = None) -> Any:
    return build_view(RunResult(meta=meta, findings=findings or [], samples=[]))


def _record(exercised: list[str], not_applicable: dict[str, str] | None = None) -> dict[str, Any]:
    na = not_applicable or {}
    return {**FUZZ, "checks_by_target": {"cpu-reference": {"exercised": exercised, "not_applicable": na}}}


def _junit_cases(view: Any) -> dict[str, str]:
    """check ID -> "passed", "failure", "skipped: MESSAGE" (the run's error case left out)."""
    suite = ET.fromstring(render(view, "junit"))
    out = {}
    for c in suite.iter("testcase"):
        cid = str(c.get("name")).split()[0]
        if cid == "run":
            continue
        skipped, failure = c.find("skipped"), c.find("failure")
        if skipped is not None:
            out[cid] = f"skipped: {skipped.get('message')}"
        else:
            out[cid] = "failure" if failure is not None else "passed"
    return out


def test_junit_passes_each_check_on_the_targets_that_ran_only() -> None:
    view = _view(META)
    assert view.targets_run() == ["cpu-reference"] and view.checks_selected() == ["FC301", "FC302"]
    suite = ET.fromstring(render(view, "junit"))
    cases = [(c.get("classname"), str(c.get("name")).split()[0]) for c in suite.iter("testcase")]
    # the passing cases, and the one error case that makes a run with a dropped target incomplete
    assert cases == [("flashcheck.cpu-reference", "FC301"), ("flashcheck.cpu-reference", "FC302"), *cases[2:]]
    assert [n for _, n in cases[2:]] == ["run"] and suite.get("tests") == "3" and suite.get("errors") == "1"


def test_every_listed_target_counts_when_none_was_dropped() -> None:
    meta = {**META, "campaign": {"stop_reason": "step budget spent"}}
    view = _view(meta)
    assert view.targets_run() == ["crashy-mixed", "cpu-reference"]
    suite = ET.fromstring(render(view, "junit"))
    assert suite.get("tests") == "4" and suite.get("failures") == "0" and suite.get("errors") == "0"


def test_a_run_written_before_the_record_reads_as_it_did() -> None:
    view = _view(FUZZ)
    assert not view.exercise_recorded() and view.verdict() == "clean"
    assert {r.status for r in view.check_results()} == {CheckStatus.UNRECORDED}
    assert set(_junit_cases(view).values()) == {"passed"}
    line = render(view, "terminal").strip().splitlines()[-1]
    assert "checks run and passed: FC202, FC250, FC301, FC304" in line and "did not record" in line
    doc = json.loads(render(view, "json"))
    assert {c["status"] for c in doc["checks"]} == {"unrecorded"} and doc["summary"]["verdict"] == "clean"


def test_every_exercised_check_passes_and_the_run_is_clean() -> None:
    view = _view(_record(["FC202", "FC250", "FC301", "FC304"]))
    assert view.verdict() == "clean" and {r.status for r in view.check_results()} == {CheckStatus.PASSED}
    assert set(_junit_cases(view).values()) == {"passed"}
    for fmt in ("terminal", "concise"):
        assert "checks run and passed: FC202, FC250, FC301, FC304" in render(view, fmt).strip().splitlines()[-1]
    assert "checks run and passed: FC202, FC250, FC301, FC304" in render(view, "markdown")


def test_a_selected_check_not_exercised_is_never_passed_and_the_run_is_incomplete() -> None:
    view = _view(_record(["FC250", "FC301"], {"FC202": "no active detection layer sees it here (no CUDA device)"}))
    by_id = {r.id: r for r in view.check_results()}
    assert by_id["FC304"].status is CheckStatus.NOT_EXERCISED and by_id["FC202"].status is CheckStatus.NOT_APPLICABLE
    assert view.verdict() == "incomplete"
    assert any("not exercised: FC304" in r for r in view.incomplete_reasons())
    cases = _junit_cases(view)
    assert cases == {
        "FC202": "skipped: not applicable: no active detection layer sees it here (no CUDA device)",
        "FC250": "passed",
        "FC301": "passed",
        "FC304": "skipped: not exercised",
    }
    suite = ET.fromstring(render(view, "junit"))
    assert suite.find("testsuite").get("skipped") == "2" and suite.get("errors") == "1"  # type: ignore[union-attr]
    for fmt in ("terminal", "concise", "markdown", "html"):
        text = render(view, fmt)
        assert "not exercised: FC304" in text, fmt
        assert "passed: FC250, FC301" not in text or "FC304" not in text.split("passed: FC250, FC301")[1][:10], fmt
        assert not text.strip().splitlines()[-1].startswith("OK"), fmt
    doc = json.loads(render(view, "json"))
    status = {c["id"]: c["status"] for c in doc["checks"]}
    assert status == {"FC202": "not applicable", "FC250": "passed", "FC301": "passed", "FC304": "not exercised"}
    assert doc["summary"]["verdict"] == "incomplete"
    sarif = json.loads(render(view, "sarif"))["runs"][0]
    assert sarif["results"] == [] and sarif["invocations"][0]["executionSuccessful"] is False
    assert sarif["properties"]["checks"]["FC304/cpu-reference"].startswith("not exercised")


def test_a_check_that_cannot_apply_is_named_with_why_and_leaves_the_run_clean() -> None:
    view = _view(_record(["FC250", "FC301"], {"FC202": "no CUDA device", "FC304": "no buckets"}))
    assert view.verdict() == "clean"
    line = render(view, "terminal").strip().splitlines()[-1]
    assert "checks run and passed: FC250, FC301" in line
    assert "not applicable here: FC202 (no CUDA device); FC304 (no buckets)" in line
    assert "FC202" not in line.split("not applicable")[0]  # never among the passed ones


def test_a_check_with_a_finding_fails_whether_or_not_it_was_recorded() -> None:
    f = Finding(
        id="FC304", name="plan-info-stable", kind="property", message="x", location=Location(target="cpu-reference")
    )
    view = _view(_record(["FC250"]), [f])
    assert {r.id: r.status for r in view.check_results()}["FC304"] is CheckStatus.FAILED
    assert view.verdict() == "findings" and _junit_cases(view)["FC304"] == "failure"


@pytest.mark.parametrize("target", ["crashy-mixed", "cpu-reference"])
def test_records_are_per_target(target: str) -> None:
    meta = {
        **META,
        "campaign": {"stop_reason": "step budget spent"},
        "checks_by_target": {target: {"exercised": ["FC301", "FC302"], "not_applicable": {}}},
    }
    view = _view(meta)
    missed = {(r.id, r.target) for r in view.check_results() if r.status is CheckStatus.NOT_EXERCISED}
    other = "cpu-reference" if target == "crashy-mixed" else "crashy-mixed"
    assert missed == {("FC301", other), ("FC302", other)}
    assert "FC301 on " + other in "; ".join(view.incomplete_reasons())
