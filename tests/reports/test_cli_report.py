"""``flashcheck report``: formats, --out, --compare and the exit codes, and clear errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashcheck.cli import EXIT_CLEAN, EXIT_FINDINGS, EXIT_INCOMPLETE, EXIT_USAGE, main


def test_report_to_stdout_fails_on_findings(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir)]) == EXIT_FINDINGS
    out = capsys.readouterr().out
    assert out.startswith("flashcheck report: fuzz") and "\x1b[" not in out  # captured stdout is not a TTY


def test_report_clean_run_exits_zero(clean_run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(clean_run_dir), "--format", "json"]) == EXIT_CLEAN
    assert json.loads(capsys.readouterr().out)["summary"]["findings"] == 0


@pytest.mark.parametrize("fmt", ["json", "junit", "sarif", "markdown", "html", "terminal"])
def test_report_out_writes_file(fmt: str, run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nested" / f"report.{fmt}"
    assert main(["report", str(run_dir), "-f", fmt, "--out", str(out)]) == EXIT_FINDINGS
    captured = capsys.readouterr()
    assert captured.out == "" and f"wrote {fmt} report to {out}" in captured.err
    text = out.read_text(encoding="utf-8")
    assert "FC301" in text
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]  # atomic write left no temp file


def test_report_force_colour_into_file(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.txt"
    main(["report", str(run_dir), "--color", "--out", str(out)])
    assert "\x1b[31m" in out.read_text(encoding="utf-8")


def test_compare_gates_on_new_findings_only(
    run_dir: Path, baseline_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(run_dir), "--compare", str(baseline_dir), "-f", "json"]) == EXIT_FINDINGS
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["compare"] == {"new": 3, "unchanged": 2, "fixed": 1}
    # no new finding, but this run recorded an error: incomplete, never green
    assert main(["report", str(run_dir), "--compare", str(run_dir)]) == EXIT_INCOMPLETE
    out = capsys.readouterr().out
    assert ("0 new, 5 unchanged, 0 fixed" in out and out.startswith("INCOMPLETE")) or "INCOMPLETE:" in out


@pytest.mark.parametrize("fmt", ["terminal", "markdown", "html", "json", "junit", "sarif"])
def test_an_incomplete_run_never_reads_as_clean(
    run_dir: Path, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "findings.json").unlink()  # no findings at all: only the incompleteness may speak
    meta.pop("finished", None)
    (run_dir / "run.json").write_text(json.dumps(meta))
    rc = main(["report", str(run_dir), "-f", fmt])
    out = capsys.readouterr().out
    assert rc == EXIT_INCOMPLETE
    assert "OK:" not in out and "No findings**" not in out and 'class="verdict ok"' not in out
    if fmt == "json":
        assert json.loads(out)["summary"]["verdict"] == "incomplete"
    if fmt == "sarif":
        assert json.loads(out)["runs"][0]["invocations"][0]["executionSuccessful"] is False
    if fmt == "junit":
        assert 'errors="1"' in out and "never finished" in out
    if fmt in ("terminal", "markdown", "html"):
        assert "incomplete" in out.lower() and "never finished" in out


def test_a_finished_run_without_findings_or_errors_is_clean(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    meta["errors"] = []
    (run_dir / "run.json").write_text(json.dumps(meta))
    (run_dir / "findings.json").unlink()
    assert main(["report", str(run_dir), "-f", "json"]) == EXIT_CLEAN
    assert json.loads(capsys.readouterr().out)["summary"]["verdict"] == "clean"


def test_sarif_paths_relative_to_source_root(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["report", str(run_dir), "-f", "sarif", "--source-root", "/work/repo"])
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert run["originalUriBaseIds"]["SRCROOT"]["uri"] == "file:///work/repo/"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "{missing}"], "run directory {missing} does not exist; pass the directory a run wrote"),
        (["report", "{file}"], "is a file, not a run directory"),
        (["report", "{empty}"], "is not a flashcheck run directory (no run.json)"),
        (
            ["report", "{run}", "--format", "pdf"],
            "unknown report format 'pdf'; choose one of terminal, concise, json, junit",
        ),
        (["report", "{run}", "--compare", "{missing}"], "baseline run directory (--compare) {missing} does not exist"),
        (["report", "{run}", "--out", "{empty}"], "is a directory; pass a file name such as"),
    ],
)
def test_bad_input_is_a_usage_error(
    args: list[str], message: str, run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.json").write_text("{}")
    names = {
        "missing": str(tmp_path / "nope"),
        "file": str(tmp_path / "file.json"),
        "empty": str(tmp_path / "empty"),
        "run": str(run_dir),
    }
    assert main([a.format(**names) for a in args]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("flashcheck report: error: ")
    assert message.format(**names) in err


def test_corrupt_run_json_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.json").write_text("{not json")
    assert main(["report", str(tmp_path)]) == EXIT_USAGE
    assert "run.json is not valid JSON" in capsys.readouterr().err
