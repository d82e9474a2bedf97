"""`flashcheck static` end to end: exit codes, formats, baseline, suppression, parse errors, configuration."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from flashcheck.cli import main
from flashcheck.errors import InvalidArgument
from flashcheck.verifier import StaticConfig, check_paths, load_config
from flashcheck.verifier.engine import Rule, rule

DATA = Path(__file__).parent.parent / "data"
FIXTURES = Path(__file__).parent.parent / "rules" / "fixtures"

BACKEND = """\
import torch


class Backend:
    def __init__(self, device):
        self.kv_indptr = torch.zeros(9, dtype=torch.int32, device=device)

    def init_forward_metadata_replay_cuda_graph(self, bs):
        return self.kv_indptr[bs].item()
"""


def project(tmp_path: Path, source: str = BACKEND, pyproject: str | None = None) -> Path:
    (tmp_path / "backend.py").write_text(source)
    if pyproject is not None:
        (tmp_path / "pyproject.toml").write_text(textwrap.dedent(pyproject))
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["static", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_exit_codes_clean_findings_and_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = project(tmp_path)
    code, out, _ = run(capsys, str(p))
    assert code == 1
    assert "backend.py:9:16: FC101 host-sync-in-hot-path" in out
    assert "chain: Backend.init_forward_metadata_replay_cuda_graph" in out
    assert run(capsys, str(p), "--ignore", "FC101")[0] == 0
    assert run(capsys, str(p), "--select", "FC10", "--ignore", "host-sync-in-hot-path")[0] == 0
    code, _, err = run(capsys, str(p), "--select", "FC9")
    assert code == 2 and "select entry 'FC9' matches no static rule" in err
    code, _, err = run(capsys, str(tmp_path / "missing"))
    assert code == 2 and "does not exist" in err


def test_internal_error_in_a_rule_exits_5_and_other_rules_still_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flashcheck.verifier import engine

    @rule("FC198", "crashes-for-the-test")
    class Crashing(Rule):
        """Test-only rule that crashes."""

        def check(self, ctx: engine.Context) -> None:
            raise RuntimeError("boom")

    try:
        code, out, err = run(capsys, str(project(tmp_path)))
    finally:
        engine._RULES.pop("FC198")
    assert code == 5  # flashcheck itself failed (`flashcheck.cli.EXIT_INTERNAL`)
    assert "rule FC198 (crashes-for-the-test) crashed" in err and "RuntimeError: boom" in err
    assert "FC101" in out


def test_parse_errors_are_reported_and_the_run_continues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = project(tmp_path)
    (p / "broken.py").write_text("def plan(:\n    pass\n")
    code, out, _ = run(capsys, str(p))
    assert code == 1
    assert "broken.py:1:10: FC199 file-does-not-parse" in out
    assert "backend.py:9:16: FC101" in out


def test_suppression_with_reason_hides_the_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = BACKEND.replace(".item()", ".item()  # flashcheck: ignore[FC101] replay path runs only in debug builds")
    code, out, _ = run(capsys, str(project(tmp_path, src)))
    assert code == 0
    assert "0 finding(s)" in out and "1 suppressed" in out


def test_suppression_without_reason_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = BACKEND.replace(".item()", ".item()  # flashcheck: ignore[FC101]")
    code, out, _ = run(capsys, str(project(tmp_path, src)))
    assert code == 1
    assert "backend.py:9:1: FC100 bare-suppression" in out and "gives no reason" in out
    assert "FC101 host-sync" not in out


def test_baseline_fails_only_on_new_findings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = project(tmp_path)
    baseline = tmp_path / "flashcheck-baseline.json"
    code, _, err = run(capsys, str(p), "--baseline", str(baseline))
    assert code == 2 and "create it with" in err
    assert run(capsys, str(p), "--baseline", str(baseline), "--write-baseline")[0] == 0
    assert json.loads(baseline.read_text())["findings"][0]["id"] == "FC101"
    # Unrelated edits above the finding move it; the baseline still matches it.
    (p / "backend.py").write_text("# a new header line\n" + BACKEND)
    code, out, _ = run(capsys, str(p), "--baseline", str(baseline))
    assert code == 0 and "1 in baseline" in out
    (p / "backend.py").write_text(BACKEND + "\n    def replay(self, bs):\n        return self.kv_indptr.tolist()\n")
    code, out, _ = run(capsys, str(p), "--baseline", str(baseline))
    assert code == 1
    assert "backend.py:12:16: FC101" in out and "backend.py:9:" not in out


def test_configuration_roots_and_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = BACKEND.replace("init_forward_metadata_replay_cuda_graph", "prepare_step")
    p = project(tmp_path, src)
    assert run(capsys, str(p))[0] == 0  # prepare_step matches no default pattern
    (p / "pyproject.toml").write_text('[tool.flashcheck.static]\nhot-paths = ["*.Backend.prepare_step"]\n')
    code, out, _ = run(capsys, str(p))
    assert code == 1 and "matches hot-paths pattern '*.Backend.prepare_step'" in out
    (p / "pyproject.toml").write_text(
        '[tool.flashcheck.static]\nhot-paths = ["*.Backend.prepare_step"]\nignore = ["FC101"]\n'
    )
    assert run(capsys, str(p))[0] == 0
    assert run(capsys, str(p), "--ignore", "FC109")[0] == 1  # the command line replaces the configured list


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            'hot-paths = "Backend.plan"',
            "hot-paths must be a list of strings, got 'Backend.plan'; write hot-paths = [\"Backend.plan\"]",
        ),
        ("hot-path = []", "unknown key 'hot-path' in [tool.flashcheck.static]; did you mean 'hot-paths'?"),
        ('default-roots = "yes"', "default-roots must be true or false"),
        ("select = [", "is not valid TOML"),
    ],
)
def test_bad_configuration_names_the_problem_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, message: str
) -> None:
    p = project(tmp_path, pyproject=f"[tool.flashcheck.static]\n{body}\n")
    code, _, err = run(capsys, str(p))
    assert code == 2
    assert message in err and str(p / "pyproject.toml") in err
    with pytest.raises(InvalidArgument):
        load_config(p / "pyproject.toml")


def test_sarif_output_validates_against_the_sarif_2_1_0_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "out.sarif"
    engine = tmp_path / "engine"  # outside a tests/ folder, where the serving rules would be quiet
    shutil.copytree(FIXTURES, engine, ignore=shutil.ignore_patterns("engine_*", "*.json"))
    (engine / "pyproject.toml").write_text("[tool.flashcheck.static]\n")
    code, _, _ = run(capsys, str(engine), "--format", "sarif", "--output", str(out_file))
    assert code == 1
    doc = json.loads(out_file.read_text())
    schema = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft4Validator)
    results = doc["runs"][0]["results"]
    rules = doc["runs"][0]["tool"]["driver"]["rules"]
    assert {r["ruleId"] for r in results} == {f"FC{n}" for n in (100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 199)}
    assert all(rules[r["ruleIndex"]]["id"] == r["ruleId"] for r in results)
    assert any("codeFlows" in r for r in results if r["ruleId"] == "FC101")
    assert "What it checks" in next(r for r in rules if r["id"] == "FC101")["help"]["text"]


def test_json_and_junit_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = project(tmp_path)
    (p / "clean.py").write_text("X = 1\n")
    code, out, _ = run(capsys, str(p), "--format", "json")
    assert code == 1
    doc = json.loads(out)
    assert doc["findings"][0]["id"] == "FC101" and doc["findings"][0]["location"]["line"] == 9
    code, out, _ = run(capsys, str(p), "--format", "junit")
    suite = ET.fromstring(out).find("testsuite")
    assert suite is not None
    # one case per rule that ran (all pass but FC101): a clean rule is a passing check, not an absent one
    cases = suite.findall("testcase")
    assert suite.get("tests") == str(len(cases)) and len(cases) >= 10 and suite.get("failures") == "1"
    failing = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failing] == ["FC101 host-sync-in-hot-path"], [c.get("name") for c in failing]


def test_pyproject_baseline_path_is_relative_to_the_pyproject(tmp_path: Path) -> None:
    p = project(tmp_path, pyproject='[tool.flashcheck.static]\nbaseline = "ci/baseline.json"\n')
    cfg = load_config(p / "pyproject.toml")
    assert cfg.baseline == str(p / "ci" / "baseline.json")
    assert cfg.root == str(p.resolve())


def test_api_run_reports_counts(tmp_path: Path) -> None:
    p = project(tmp_path)
    result = check_paths([str(p)], StaticConfig(root=str(p)))
    assert [f.id for f in result.findings] == ["FC101"]
    assert result.files == ["backend.py"] and result.roots == 1 and result.lines == 9


def test_static_cli_never_imports_torch(tmp_path: Path) -> None:
    p = project(tmp_path)
    code = (
        "import sys; from flashcheck.cli import main; rc = main(['static', sys.argv[1]]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "FC101" in proc.stdout


def test_a_static_run_is_a_run_every_report_format_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = project(tmp_path)
    run_dir = tmp_path / "static-run"
    code, out, _ = run(capsys, str(p), "--run-dir", str(run_dir))
    assert code == 1 and "FC101" in out
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["kind"] == "static" and "FC101" in meta["checks"] and "finished" in meta
    for fmt in ("markdown", "html", "terminal", "concise"):
        assert main(["report", str(run_dir), "--format", fmt]) == 1, fmt
        assert "FC101" in capsys.readouterr().out, fmt
    code, out, _ = run(capsys, str(p), "--format", "md")
    assert code == 1 and out.startswith("#") and "FC101" in out


def test_a_package_named_dist_or_build_is_checked_and_build_outputs_are_not(tmp_path: Path) -> None:
    """`epserve/dist/a2a.py` and `epserve/scale/dist/comm/a2a.py` (namespace folders of sources) are checked;
    `build/lib/...` (setuptools' copy of the sources, also beside a stray `build/_version.py`) and a wheel folder are
    build outputs and are skipped, as are virtual environments."""
    from flashcheck.verifier.source import discover

    files = {
        "epserve/dist/a2a.py": BACKEND,
        "epserve/build/steps.py": BACKEND,
        "epserve/engine.py": "from epserve.dist.a2a import Backend\n",
        "epserve/scale/dist/comm/a2a.py": BACKEND,
        "build/_version.py": "version = '0.1'\n",
        "build/lib/epserve/engine.py": BACKEND,
        "build/lib.linux-x86_64-cpython-311/epserve/engine.py": BACKEND,
        "dist/epserve-0.1.tar.gz": "",
        ".venv/lib/site.py": BACKEND,
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = sorted(p.relative_to(tmp_path).as_posix() for p in discover([str(tmp_path)], (), tmp_path))
    sources = ["epserve/build/steps.py", "epserve/dist/a2a.py", "epserve/scale/dist/comm/a2a.py"]
    assert found == ["build/_version.py", *sources[:2], "epserve/engine.py", sources[2]]
    result = check_paths([str(tmp_path)], StaticConfig(root=str(tmp_path), jobs=1))
    assert {f.location.file for f in result.findings if f.id == "FC101"} == set(sources)


def test_files_python_reads_are_checked_whatever_their_encoding(tmp_path: Path) -> None:
    """A UTF-8 byte-order mark, a PEP 263 coding declaration and CRLF line ends are valid Python: each file is
    checked, its findings on the lines Python numbers; bytes that Python cannot decode are FC199."""
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbf" + BACKEND.encode())
    latin = "# -*- coding: latin-1 -*-\n# caf\xe9\n" + BACKEND
    (tmp_path / "latin.py").write_bytes(latin.encode("latin-1"))
    (tmp_path / "crlf.py").write_bytes(BACKEND.replace("\n", "\r\n").encode())
    (tmp_path / "bad.py").write_bytes(b"x = '\xff'\n")
    result = check_paths([str(tmp_path)], StaticConfig(root=str(tmp_path), jobs=1))
    sites = {(f.location.file, f.location.line, f.id) for f in result.findings}
    assert {("bom.py", 9, "FC101"), ("latin.py", 11, "FC101"), ("crlf.py", 9, "FC101")} <= sites
    assert {(f, i) for f, _, i in sites if i == "FC199"} == {("bad.py", "FC199")}


def test_suppressions_and_lines_stay_on_python_lines_past_form_feeds_and_unicode_line_breaks(tmp_path: Path) -> None:
    """A form feed, or U+0085 / U+2028 inside a comment, does not end a line for Python: a suppression comment still
    suppresses the line below it, and the file's line count and line texts are Python's."""
    note = "        # flashcheck: ignore[FC101] debug-only path\n"
    suppressed = BACKEND.replace("        return self.kv_indptr", note + "        return self.kv_indptr")
    (tmp_path / "ff.py").write_text("import torch\n\x0c\n" + suppressed)
    (tmp_path / "nel.py").write_bytes(("# coding: latin-1\n# a\x85b\n" + suppressed).encode("latin-1"))
    (tmp_path / "ls.py").write_text("# a\u2028b\n" + BACKEND)
    result = check_paths([str(tmp_path)], StaticConfig(root=str(tmp_path), jobs=1))
    assert {(f.location.file, f.location.line) for f in result.findings} == {("ls.py", 10)}
    assert result.suppressed == 2 and result.lines == sum(
        (tmp_path / n).read_bytes().count(b"\n") for n in ("ff.py", "nel.py", "ls.py")
    )


def test_a_folder_that_cannot_be_read_stops_the_run_with_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its files would otherwise go unchecked without a word: the run stops (exit 2) and names the folder."""
    import os

    (tmp_path / "pkg" / "locked").mkdir(parents=True)
    (tmp_path / "pkg" / "backend.py").write_text(BACKEND)
    (tmp_path / "pkg" / "locked" / "kernels.py").write_text(BACKEND)
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(InvalidArgument, match=r"cannot read folder .*locked: Permission denied"):
        check_paths([str(tmp_path)], StaticConfig(root=str(tmp_path), jobs=1))
    # excluded, as the message says, the folder is never listed and the rest is checked
    result = check_paths([str(tmp_path)], StaticConfig(root=str(tmp_path), jobs=1, exclude=("pkg/locked/*",)))
    assert result.files == ["pkg/backend.py"]
