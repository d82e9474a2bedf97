"""A new user's walk through the command line, on CPU in a temporary directory: every bad input gets a one-line
error and its documented exit code (`flashcheck.cli`), nothing that is not a regular file is ever replaced, a run
directory holds one run (fresh or `--resume`) and one writer, and no failed or interrupted run reads as clean."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flashcheck import cli
from flashcheck._files import RunDirLock, atomic_write_text
from flashcheck.cli import main
from flashcheck.errors import InvalidArgument
from tests.conftest import PLANTED_BUG_LAYERS

SMALL = json.dumps({"max_kv_len": 256, "chunk": 32, "max_pages": 256})
FAULTY = "faulty_targets:PlanInfoVaries"  # FC304 on replay (tests/quality)


def one_line_error(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("flashcheck ")]
    assert lines, err
    for n in needles:
        assert n in err, (n, err)
    return err


def fuzz(out: Path, *extra: str, target: str = "cpu-reference") -> int:
    # a fixed seed: 3 examples of seed 1 replay a graph, so every selected check runs (a seed whose examples never
    # replay leaves FC304 not exercised, and the run is incomplete, never clean)
    return main([
        "fuzz", "--target", target, "--config", SMALL, "--examples", "3", "--profile", "ci",
        "--device", "cpu", "--seed", "1", "--out", str(out), *extra,
    ])  # fmt: skip


# ---- outputs: nothing but a regular file is replaced; modes follow the umask -----------------------------------
@pytest.fixture(scope="module")
def _clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One clean fuzz run (default layers) in this process, made once for the module's tests that read one."""
    out = tmp_path_factory.mktemp("clean-run") / "run"
    assert fuzz(out) == 0
    return out


@pytest.fixture
def run_dir(_clean_run: Path, tmp_path: Path) -> Path:
    """A clean run directory of the test's own (a copy of `_clean_run`): a test may change it."""
    out = tmp_path / "run"
    shutil.copytree(_clean_run, out, symlinks=True)
    return out


def test_report_never_replaces_a_fifo_a_symlink_or_a_directory(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    target = tmp_path / "kept.txt"
    target.write_text("keep me")
    link = tmp_path / "link.md"
    link.symlink_to(target)
    capsys.readouterr()
    for path, kind in ((fifo, "a FIFO"), (link, "a symbolic link")):
        assert main(["report", str(run_dir), "--format", "md", "-o", str(path)]) == 2
        one_line_error(capsys, str(path), kind)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink() and target.read_text() == "keep me"
    assert main(["static", str(tmp_path), "--output", str(fifo)]) == 2
    one_line_error(capsys, "a FIFO")
    if Path("/dev/null").exists():
        with pytest.raises(InvalidArgument, match="character device"):
            atomic_write_text("/dev/null", "x")
        assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_an_unwritable_out_is_one_line_and_exit_2(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    capsys.readouterr()
    assert main(["report", str(run_dir), "--out", str(blocker / "report.html"), "--format", "html"]) == 2
    one_line_error(capsys, "cannot be written")


def test_written_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o640
    os.chmod(tmp_path / "a.txt", 0o600)
    atomic_write_text(tmp_path / "a.txt", "y")  # an existing file keeps its mode
    assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o600


# ---- run directories: one run, one writer --------------------------------------------------------------------
def test_fuzz_refuses_a_directory_that_holds_a_run_unless_resumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "quality"))
    out = tmp_path / "run"
    # seed 0: the planted bug is found and shrunk soonest
    assert fuzz(out, "--layers", PLANTED_BUG_LAYERS, "--seed", "0", target=FAULTY) == 1
    before = json.loads((out / "findings.json").read_text())["findings"]
    capsys.readouterr()
    assert fuzz(out) == 2  # a clean target into the old directory: refused, the old findings stay
    one_line_error(capsys, "already holds a run", "--resume")
    assert json.loads((out / "findings.json").read_text())["findings"] == before
    assert fuzz(out, "--resume") == 0
    assert json.loads((out / "findings.json").read_text())["findings"] == before  # kept, not lost


def test_a_second_writer_of_a_run_directory_gets_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    with RunDirLock(out):
        assert fuzz(out) == 2
        one_line_error(capsys, "is in use by pid")
        assert main(["campaign", "--target", "cpu-reference", "--steps", "5", "--out", str(out)]) == 2
        one_line_error(capsys, "is in use")
    assert fuzz(out) == 0  # released: the directory is usable again


def test_the_default_fuzz_directory_is_fresh_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert (
        main(["fuzz", "--config", SMALL, "--examples", "3", "--profile", "ci", "--device", "cpu", "--seed", "1"]) == 0
    )
    runs = list((tmp_path / "runs").glob("fuzz-*"))
    assert len(runs) == 1 and (runs[0] / "run.json").is_file()


# ---- bad input: one line, exit 2, nothing created ------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["fuzz", "--target", "nope"], "unknown target 'nope'"),
        (["fuzz", "--config", '{"no_such_key": 1}'], "bad configuration for target"),
        (["fuzz", "--time", "abc"], "--time 'abc' does not parse"),
        (["fuzz", "--examples", "0"], "--examples 0"),
        (["campaign", "--target", "cpu-reference", "--chunk-steps", "0"], "--chunk-steps 0"),
        (["campaign", "--target", "cpu-reference", "--steps", "0"], "--steps 0"),
        (["campaign", "--target", "cpu-reference", "--step-timeout", "abc"], "--step-timeout 'abc'"),
        (["campaign", "--target", "cpu-reference", "--target-config", '{"no_such_key": 1}'], "bad configuration"),
        (["campaign", "--target", "cpu-reference", "--corpus", "redis://localhost:1/0"], "--corpus redis://"),
        (["replay", "."], "is a directory"),
        (["replay", "missing.json"], "does not exist"),
        (["report", "."], "not a flashcheck run directory"),
        (["report", "--format", "pdf", "."], "unknown report format 'pdf'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_output(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    if "--corpus" in argv:
        import importlib.util

        if importlib.util.find_spec("redis") is not None:
            pytest.skip("the redis package is installed: the corpus error is then about the server, not the package")
    out = tmp_path / "out"
    extra = ["--out", str(out)] if argv[0] in ("fuzz", "campaign") else []
    assert main([*argv, *extra]) == 2
    one_line_error(capsys, needle)
    assert not out.exists(), "bad input must be refused before the run directory is created"


def test_format_aliases(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["report", str(run_dir), "--format", "md"]) == 0
    assert capsys.readouterr().out.startswith("#")
    assert main(["report", str(run_dir), "--format", "text", "--no-color"]) == 0
    assert "ok: 0 finding" in capsys.readouterr().out.lower()


# ---- the exit-code contract ---------------------------------------------------------------------------------
def _raise(exc: BaseException) -> Callable[..., int]:
    def run(*args: Any, **kwargs: Any) -> int:
        raise exc

    return run


@pytest.mark.parametrize(
    ("exc", "code", "needle"),
    [
        (RuntimeError("boom"), cli.EXIT_INTERNAL, "internal error: RuntimeError: boom (traceback in "),
        (KeyboardInterrupt(), cli.EXIT_INTERRUPTED, "interrupted"),
        (ModuleNotFoundError("No module named 'torch'", name="torch"), cli.EXIT_ENV, "pip install 'flashcheck[torch]'"),
    ],
)
def test_exit_codes_of_what_the_user_did_not_cause(
    exc: BaseException, code: int, needle: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from flashcheck.cli import rules

    monkeypatch.setattr(rules, "run", _raise(exc))
    assert main(["rules"]) == code
    err = one_line_error(capsys, needle)
    if code == cli.EXIT_INTERNAL:
        saved = Path(err.split("traceback in ", 1)[1].split(";")[0])
        assert "RuntimeError: boom" in saved.read_text()
        saved.unlink()


def test_a_cuda_run_without_a_gpu_is_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert fuzz(tmp_path / "run", "--device", "cuda") == 3
    one_line_error(capsys, "cannot run here")


# ---- no failed run reads green ---------------------------------------------------------------------------------
def test_an_interrupted_fuzz_run_is_incomplete_in_every_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flashcheck.fuzzing import stateful

    monkeypatch.setattr(stateful, "run_state_machine_as_test", _raise(KeyboardInterrupt()))
    out = tmp_path / "run"
    assert fuzz(out) == cli.EXIT_INTERRUPTED
    meta = json.loads((out / "run.json").read_text())
    assert "finished" not in meta and any("interrupted" in e for e in meta["errors"])
    monkeypatch.undo()
    for fmt in ("terminal", "json", "junit", "sarif", "markdown", "html"):
        capsys.readouterr()
        assert main(["report", str(out), "--format", fmt]) == cli.EXIT_INCOMPLETE, fmt
        text = capsys.readouterr().out
        assert "interrupted" in text, fmt


@pytest.mark.slow
def test_ctrl_c_stops_a_campaign_cleanly_resumable_and_never_clean(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(Path(cli.__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, "-m", "flashcheck", "campaign", "--target", "cpu-reference", "--config", SMALL]
    proc = subprocess.Popen(
        [*cmd, "--time", "5m", "--log-every", "3600", "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out / "samples.jsonl").exists():
        time.sleep(0.5)
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole foreground group, workers included
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == cli.EXIT_INTERRUPTED, text[-2000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    meta = json.loads((out / "run.json").read_text())
    assert meta["campaign"]["stop_reason"].startswith("interrupted") and meta["errors"] == []
    assert main(["report", str(out), "--format", "json"]) == cli.EXIT_INCOMPLETE
    resumed = subprocess.run(
        [sys.executable, "-m", "flashcheck", "campaign", "--resume", str(out), "--steps", "20"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == cli.EXIT_CLEAN, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert main(["report", str(out), "--format", "json"]) == cli.EXIT_CLEAN


def test_a_clean_run_names_the_checks_that_ran_and_junit_passes_each(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import xml.etree.ElementTree as ET

    capsys.readouterr()
    assert main(["report", str(run_dir), "--no-color"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("OK:") and "checks run and passed: FC201" in line and "FC305" in line, line
    assert main(["report", str(run_dir), "--format", "junit"]) == 0
    suite = ET.fromstring(capsys.readouterr().out)
    cases = suite.findall(".//testcase")
    assert suite.get("tests") == str(len(cases)) and len(cases) >= 9 and suite.get("failures") == "0"
    assert {str(c.get("name")).split()[0] for c in cases} >= {"FC201", "FC250", "FC301", "FC303", "FC305"}
    assert all("cpu-reference" in str(c.get("classname")) for c in cases) and not suite.findall(".//failure")


def test_a_closed_pipe_is_quiet_and_exit_141() -> None:
    import subprocess
    import sys

    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(Path(cli.__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        f"{sys.executable} -m flashcheck rules FC301 | head -c 10; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode in (0, cli.EXIT_BROKEN_PIPE), proc.stderr  # 0 when the page fit into the pipe's buffer
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def test_progress_prints_periodic_lines_off_a_terminal() -> None:
    import io

    from flashcheck.cli._common import Progress

    buf = io.StringIO()
    progress = Progress("flashcheck fuzz", buf, every=0.0, live=False)
    progress.tick("10 steps run")
    progress.tick("20 steps run")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("flashcheck fuzz: ") and lines[1].endswith("20 steps run")


def test_a_target_is_named_as_its_findings_name_it() -> None:
    from flashcheck.reports import build_view
    from flashcheck.rundir import RunResult

    meta = {
        "kind": "campaign",
        "target": "crashy:Mixed,cpu-reference",
        "targets": ["crashy-mixed", "cpu-reference"],
        "campaign": {"dropped_targets": {"crashy:Mixed": "no GPU"}, "stop_reason": "time budget spent"},
        "started": 0.0,
        "finished": 1.0,
    }
    view = build_view(RunResult(meta=meta, findings=[], samples=[]))
    assert view.verdict() == "incomplete"
    assert "target crashy-mixed (crashy:Mixed) did not run: no GPU" in view.incomplete_reasons()


def test_a_fuzz_run_records_its_detection_layers_and_every_report_shows_the_skipped_ones(
    run_dir: Path, tmp_path: Path
) -> None:
    env = json.loads((run_dir / "run.json").read_text())["environment"]
    assert env["detection layers"] == "graph_replay, dispatch"  # the default layers, on CPU
    assert "cupti: no CUDA device" in env["layers skipped"]
    for fmt, needle in (("terminal", "layers skipped: "), ("md", "Layers skipped: "), ("html", "layers skipped")):
        out = tmp_path / f"report.{fmt}"
        assert main(["report", str(run_dir), "--format", fmt, "-o", str(out)]) == 0
        text = out.read_text()
        assert needle in text and "cupti: no CUDA device" in text, fmt
    meta = json.loads((run_dir / "run.json").read_text())
    del meta["environment"]["layers skipped"]  # a run where every selected layer ran says nothing of skips
    (run_dir / "run.json").write_text(json.dumps(meta))
    quiet = tmp_path / "quiet.md"
    assert main(["report", str(run_dir), "--format", "md", "-o", str(quiet)]) == 0
    assert "Layers skipped" not in quiet.read_text() and "Detection layers: graph_replay" in quiet.read_text()


def test_a_second_fuzz_run_in_one_process_records_only_its_own_layers(run_dir: Path, tmp_path: Path) -> None:
    second = tmp_path / "second"
    assert fuzz(second, "--layers", "off") == 0  # run_dir's run had the default layers, in this process before
    env = json.loads((second / "run.json").read_text())["environment"]
    assert env["detection layers"] == "none (layers off)" and "layers skipped" not in env


def test_facts_of_several_sessions_keep_each_value_once() -> None:
    from flashcheck.rundir import merge_facts

    a = {"detection layers": "x, y", "layers skipped": "cupti: no cupti-python"}
    b = {"detection layers": "x"}
    merged = merge_facts(a, b, merge_facts(b, a))  # a merged value counts as its parts
    assert merged == {"detection layers": "x, y | x", "layers skipped": "cupti: no cupti-python"}
    assert merge_facts() == {} and merge_facts(b, b) == b


def test_a_campaigns_environment_keeps_every_workers_layers_and_the_newest_other_facts() -> None:
    from flashcheck.rundir import add_environment

    env: dict[str, Any] = {}
    add_environment(env, {"device": "cpu", "detection layers": "x, y", "layers skipped": "cupti: none here"})
    add_environment(env, {"device": "cuda:0", "detection layers": "x, y, z"})  # a worker restarted elsewhere
    assert env == {
        "device": "cuda:0",
        "detection layers": "x, y | x, y, z",
        "layers skipped": "cupti: none here",  # not overwritten by a worker that skipped nothing
    }
