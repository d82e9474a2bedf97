"""Helpers for campaign tests: run the CLI in-process (workers are real subprocesses) and read run directories."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
if str(HERE) not in sys.path:  # test modules import `crashy` (the targets workers load as crashy:Class)
    sys.path.insert(0, str(HERE))


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    return env


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def findings_of(run_dir: Path) -> list[dict[str, Any]]:
    p = run_dir / "findings.json"
    return read_json(p)["findings"] if p.exists() else []


def worker_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "flashcheck.campaign.worker", *args]


@pytest.fixture(autouse=True)
def _on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # the supervisor forwards sys.path to its workers: make sure `crashy` is importable there
    monkeypatch.syspath_prepend(str(HERE))
