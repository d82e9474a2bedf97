"""Behaviour of the view model and the text renderers beyond their goldens: compare status, colour rules, JUnit
structure, Markdown limits, and that reports never import torch."""

from __future__ import annotations

import io
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding, Location
from flashcheck.reports import FindingStatus, build_view, check_format, markdown, render, terminal
from flashcheck.reports.model import fmt_bytes
from flashcheck.rundir import RunResult, load_run


def test_compare_marks_new_fixed_unchanged(run_dir: Path, baseline_dir: Path) -> None:
    view = build_view(load_run(run_dir), baseline=load_run(baseline_dir))
    status = {(e.finding.id, e.finding.location.step): e.status for e in view.entries}
    assert status == {
        ("FC102", None): FindingStatus.UNCHANGED,
        ("FC203", 41): FindingStatus.NEW,
        ("FC301", 57): FindingStatus.UNCHANGED,
        ("FC301", 88): FindingStatus.NEW,
        ("FC304", 103): FindingStatus.NEW,
    }
    assert [(e.finding.id, e.status) for e in view.fixed] == [("FC205", FindingStatus.FIXED)]
    assert view.failing()
    # compared with itself nothing is new, so the gate passes even though findings remain
    same = build_view(load_run(run_dir), baseline=load_run(run_dir))
    assert same.count(FindingStatus.NEW) == 0 and same.count(FindingStatus.UNCHANGED) == 5
    assert not same.failing()


def test_view_statistics(run_dir: Path) -> None:
    view = build_view(load_run(run_dir), run_dir=run_dir)
    first = view.first_seen()
    assert list(first) == ["FC203", "FC301", "FC304"]
    assert first["FC203"] < first["FC301"] < first["FC304"]
    assert len(view.occurrences()["FC301"]) == 3
    assert sum(n for _, n in view.batch_size_histogram()) == len(view.samples) == 140
    assert view.kv_token_histogram()[0][0] == "≤64"
    over = [(s.step, u, a) for s, u, a in view.workspace_points()["int_workspace"] if u > a]
    assert over == [(103, 9751756, 8 << 20)]
    # the reproducer file of each non-static finding is embedded; the static one has none
    texts = {e.finding.id: e.repro_text for e in view.entries}
    assert texts["FC102"] is None and '"check": "FC203"' in (texts["FC203"] or "")
    assert fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(100) == "100 B"


def test_unknown_check_still_renders() -> None:
    f = Finding(id="FC399", name="made-up-property", kind="property", message="m", location=Location(step=1))
    result = RunResult(meta={"schema": 1, "seed": 3}, findings=[f])
    for fmt in ("terminal", "sarif", "junit", "markdown", "html", "json"):
        assert "FC399" in render(result, fmt)


def test_check_format_names_the_choices() -> None:
    with pytest.raises(InvalidArgument, match="unknown report format 'pdf'; choose one of terminal, concise, json"):
        check_format("pdf")


def test_terminal_colour_only_when_asked(run_dir: Path) -> None:
    result = load_run(run_dir)
    plain, coloured = render(result, "terminal"), render(result, "terminal", color=True)
    assert "\x1b[" not in plain and "\x1b[31m" in coloured
    assert terminal._Painter(True)("x", "red") == "\x1b[31mx\x1b[0m"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_use_color_follows_tty_and_no_color(monkeypatch: pytest.MonkeyPatch, no_color_env: None) -> None:
    assert terminal.use_color(_Tty()) is True
    assert terminal.use_color(io.StringIO()) is False
    monkeypatch.setenv("NO_COLOR", "")  # any value, even empty, turns colour off (no-color.org)
    assert terminal.use_color(_Tty()) is False
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert terminal.use_color(_Tty()) is False


def test_terminal_shows_seed_environment_and_verdict(run_dir: Path, clean_run_dir: Path) -> None:
    text = render(load_run(run_dir), "terminal")
    head = text.splitlines()[:2]
    assert "seed=1234" in head[0] and "device=NVIDIA H100 80GB HBM3" in head[1] and "flashinfer=0.6.13" in head[1]
    assert text.rstrip().splitlines()[-1].startswith("FAIL: 5 finding(s) (4 error, 1 warning)")
    last = render(load_run(clean_run_dir), "terminal").rstrip().splitlines()[-1]
    assert last.startswith("OK: 0 finding(s); seed=5"), last


def test_junit_one_case_per_check_and_target(run_dir: Path, baseline_dir: Path) -> None:
    xml = render(load_run(run_dir), "junit", baseline=load_run(baseline_dir))
    suite = ET.fromstring(xml).find("testsuite")
    assert suite is not None
    cases = {(c.get("classname"), c.get("name")): c for c in suite.iter("testcase")}
    assert set(cases) == {
        ("flashcheck.flashinfer-paged", "FC102 host-sync-in-graph-capture"),
        ("flashcheck.flashinfer-paged", "FC203 persistent-buffer-reallocated"),
        ("flashcheck.flashinfer-paged", "FC205 plan-outside-replay-window"),
        ("flashcheck.flashinfer-paged", "FC301 csr-well-formed"),
        ("flashcheck.flashinfer-paged", "FC302 replay-matches-eager"),
        ("flashcheck.flashinfer-paged", "FC304 workspace-within-bounds"),
        ("flashcheck.flashinfer-paged", "run"),
    }
    fc301 = cases[("flashcheck.flashinfer-paged", "FC301 csr-well-formed")].find("failure")
    assert fc301 is not None and fc301.get("message", "").startswith("2 finding(s): kv_indptr[9]=34891")
    assert "indices-in-range" in (fc301.text or "")
    passing = cases[("flashcheck.flashinfer-paged", "FC302 replay-matches-eager")]
    assert passing.find("failure") is None
    fixed = cases[("flashcheck.flashinfer-paged", "FC205 plan-outside-replay-window")]
    assert fixed.find("failure") is None and "fixed since the baseline" in (fixed.findtext("system-out") or "")
    assert cases[("flashcheck.flashinfer-paged", "run")].find("error") is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("7", "4", "1")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["seed"] == "1234" and props["env.device"] == "NVIDIA H100 80GB HBM3"


def test_markdown_caps_long_reports(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(markdown, "MAX_FINDINGS", 2)
    text = render(load_run(run_dir), "markdown")
    assert "*... and 3 more finding(s): see the full report.*" in text
    assert text.count("<details>") == 2


def test_markdown_escapes_table_cells() -> None:
    assert markdown._cell("a|b\nc") == "a\\|b c"
    assert markdown._code("x`y") == "`` x`y ``"


def test_reports_never_import_torch(run_dir: Path) -> None:
    code = (
        "import sys, flashcheck.reports as r, flashcheck.cli.report_cmd\n"
        "from flashcheck.rundir import load_run\n"
        f"res = load_run({str(run_dir)!r})\n"
        "for f in r.FORMATS: r.render(res, f)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'flashinfer'))\n"
        "assert not bad, bad\n"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": src}, check=False
    )
    assert proc.returncode == 0, proc.stderr
