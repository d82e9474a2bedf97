"""Which checks a report says ran: every listed check on every target that ran, none on a target a campaign dropped
as unable to run here (those checks never ran there)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from flashcheck.reports import build_view, render
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


def test_junit_passes_each_check_on_the_targets_that_ran_only() -> None:
    view = build_view(RunResult(meta=META, findings=[], samples=[]))
    assert view.targets_run() == ["cpu-reference"] and view.checks_run() == ["FC301", "FC302"]
    suite = ET.fromstring(render(view, "junit"))
    cases = [(c.get("classname"), str(c.get("name")).split()[0]) for c in suite.iter("testcase")]
    # the passing cases, and the one error case that makes a run with a dropped target incomplete
    assert cases == [("flashcheck.cpu-reference", "FC301"), ("flashcheck.cpu-reference", "FC302"), *cases[2:]]
    assert [n for _, n in cases[2:]] == ["run"] and suite.get("tests") == "3" and suite.get("errors") == "1"


def test_every_listed_target_counts_when_none_was_dropped() -> None:
    meta = {**META, "campaign": {"stop_reason": "step budget spent"}}
    view = build_view(RunResult(meta=meta, findings=[], samples=[]))
    assert view.targets_run() == ["crashy-mixed", "cpu-reference"]
    suite = ET.fromstring(render(view, "junit"))
    assert suite.get("tests") == "4" and suite.get("failures") == "0" and suite.get("errors") == "0"
