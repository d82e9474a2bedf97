"""`pip install flashcheck` into an empty virtual environment brings no torch, and the commands that never need it
(`static`, `report`, `rules`) run there; a runtime command says in one line what to install (exit 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_core_install_has_no_torch_and_runs_static_and_report(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)  # empty: this interpreter's pip installs into it (--python)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip_cmd = [sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check"]
    # the wheel is built with this environment's setuptools (no isolated build environment to set up: the README's
    # install builds with isolation), then installed as a user's `pip install` would install it
    wheel = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), ROOT],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert wheel.returncode == 0, wheel.stderr[-3000:]
    built = next(tmp_path.glob("flashcheck-*.whl"))
    pip = subprocess.run(
        # --no-compile: the commands below run a small part of what pip would byte-compile (numpy, hypothesis)
        [*pip_cmd, "install", "-q", "--no-compile", str(built)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=800,
    )
    if pip.returncode != 0 and "No matching distribution" in pip.stderr + pip.stdout:
        pytest.skip(f"no package index here: {pip.stderr[-300:]}")
    assert pip.returncode == 0, pip.stderr[-3000:]
    listed = subprocess.run([*pip_cmd, "list", "--format", "json"], capture_output=True, text=True, env=env, check=True)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "flashcheck" in names and "torch" not in names, sorted(names)
    exe = str(env_dir / "bin" / "flashcheck")

    code = tmp_path / "engine"
    code.mkdir()
    (code / "runner.py").write_text(
        "import torch\n\nclass Runner:\n    def replay(self, seq_lens):\n        return int(seq_lens.max().item())\n"
    )
    static = subprocess.run([exe, "static", str(code)], capture_output=True, text=True, env=env, check=False)
    assert static.returncode in (0, 1), static.stderr
    assert "file(s)" in static.stdout + static.stderr

    run_dir = ROOT / "reports" / "h100-campaign"  # a committed run directory
    report = subprocess.run(
        [exe, "report", str(run_dir), "--format", "md"], capture_output=True, text=True, env=env, check=False
    )
    assert report.returncode in (0, 1, 4), report.stderr
    assert report.stdout.startswith("#") and "Traceback" not in report.stderr

    rules = subprocess.run([exe, "rules"], capture_output=True, text=True, env=env, check=False)
    assert rules.returncode == 0 and "FC301" in rules.stdout

    fuzz = subprocess.run(
        [exe, "fuzz", "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env, check=False
    )
    assert fuzz.returncode == 3, fuzz.stderr
    assert "flashcheck[torch]" in fuzz.stderr and "Traceback" not in fuzz.stderr
    assert not (tmp_path / "run").exists()
