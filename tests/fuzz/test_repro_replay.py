"""Reproducers: a finding's JSON repro, replayed by ``flashcheck replay`` in a fresh process, reproduces it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import faulty_targets as ft
import pytest

from flashcheck.fuzzing.stateful import FuzzFailure
from flashcheck.targets.registry import make_target, target_spec
from tests.conftest import PLANTED_BUG_LAYERS, STALE_LAST_PAGE_LEN

SRC = str(Path(__file__).resolve().parents[2] / "src")
SMALL = {"max_kv_len": 256, "chunk": 32, "max_pages": 256}


# the reproducer comes from the fuzz run tests/quality/test_find_faulty.py checks: one worker runs it once for both
# (--dist loadgroup)
pytestmark = STALE_LAST_PAGE_LEN


def _replay(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}  # src only: the repro names its own module dir
    return subprocess.run(
        [sys.executable, "-m", "flashcheck", "replay", str(path), "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def repro_path(stale_last_page_len_failure: FuzzFailure) -> Path:
    rec = stale_last_page_len_failure.records[0]
    assert rec.path is not None
    return rec.path


@pytest.mark.slow
def test_repro_reproduces_in_a_fresh_process(repro_path: Path, tmp_path: Path) -> None:
    doc = json.loads(repro_path.read_text())
    assert doc["scenario"]["target"] == "faulty_targets:StaleLastPageLen"
    assert doc["command"] == f"flashcheck replay {repro_path}"
    proc = _replay(repro_path, tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "reproduced: FC303" in proc.stdout
    assert "def test_replay_matches_eager_does_not_come_back" in proc.stdout  # the pasteable snippet


@pytest.mark.slow
def test_fixed_target_does_not_reproduce(repro_path: Path, tmp_path: Path) -> None:
    doc = json.loads(repro_path.read_text())
    doc["scenario"]["target"] = "cpu-reference"  # the same scenario against the fixed (clean) target
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps(doc))
    proc = _replay(fixed, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not reproduced" in proc.stdout


@pytest.mark.parametrize("content", ["not json", "{}", "[1, 2]"])
def test_bad_file_exits_2(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    proc = _replay(bad, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "reproducer" in proc.stderr or "JSON" in proc.stderr


def test_missing_file_exits_2(tmp_path: Path) -> None:
    assert _replay(tmp_path / "nope.json", tmp_path).returncode == 2


def test_every_builtin_target_rebuilds_from_its_config() -> None:
    from flashcheck.targets.registry import BUILTIN_TARGETS

    for name in BUILTIN_TARGETS:
        t = make_target(name)
        assert make_target(name, **t.config()).config() == t.config(), name


def test_module_class_spec_round_trips() -> None:
    t = ft.PlanInfoVaries(**SMALL)
    spec = target_spec(t)
    assert spec == "faulty_targets:PlanInfoVaries"
    again = make_target(spec, **t.config())
    assert type(again) is ft.PlanInfoVaries and again.config() == t.config()
    assert target_spec(make_target("cpu-reference")) == "cpu-reference"


@pytest.mark.parametrize("spec", ["no_such_module_xyz:Thing", "faulty_targets:Missing", "zzz-unknown"])
def test_bad_target_specs_are_usage_errors(spec: str) -> None:
    from flashcheck.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        make_target(spec)


def test_fuzz_cli_writes_a_run_directory(tmp_path: Path) -> None:
    from flashcheck.cli import main

    out = tmp_path / "run"
    rc = main(
        [
            "fuzz",
            "--target",
            "faulty_targets:PlanInfoVaries",
            "--config",
            json.dumps(SMALL),
            "--budget",
            "40",
            "--seed",
            "0",
            "--device",
            "cpu",
            "--profile",
            "ci",
            "--layers",
            PLANTED_BUG_LAYERS,
            "--out",
            str(out),
        ]
    )
    assert rc == 1
    findings = json.loads((out / "findings.json").read_text())["findings"]
    assert {f["id"] for f in findings} == {"FC304"}
    assert list((out / "repros").glob("*.json")) and (out / "run.json").is_file()
