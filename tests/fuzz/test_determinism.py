"""A fuzz run does not depend on what ran before it in the process: one seed, one run (``--flashcheck-seed``)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from flashcheck.fuzzing.stateful import fuzz_target
from flashcheck.scenario import Step, StepResult

QUALITY = str(Path(__file__).resolve().parents[1] / "quality")
SMALL = {"max_kv_len": 256, "chunk": 32, "max_pages": 256}


def _steps(seed: int) -> list[Step]:
    seen: list[Step] = []

    def record(step: Step, result: StepResult) -> None:
        seen.append(step)

    fuzz_target(
        "cpu-reference", config=SMALL, budget=6, seed=seed, device="cpu", profile="ci", database=None, check=record
    )
    return seen


def test_a_seed_draws_the_same_examples_whatever_the_process_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hypothesis draws constants from the source of the local modules imported so far; a fuzz run draws none."""
    first = _steps(5)
    # a module of the user's that this process imports between two runs: constants in the ranges the fuzzer draws
    (tmp_path / "engine_limits.py").write_text(f"LIMITS = {tuple(range(101, 400, 3))!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("engine_limits")
    try:
        assert _steps(5) == first
    finally:
        sys.modules.pop("engine_limits", None)


# What an in-process pytest run (pytester's) leaves behind: it removes from sys.modules every module it imported and
# leaves the packages' attributes that name them. Run in a fresh interpreter, where the driver is not imported yet.
AFTER_AN_IN_PROCESS_RUN = """
import sys

import numpy  # extension modules load once per process: the outer pytest process has them
import torch

import flashcheck.pytest_plugin  # the plugin (and what it imports) is loaded before any run

outer = dict(sys.modules)
import flashcheck.session  # an earlier in-process run imported the driver, the catalogue, the properties

sys.modules.clear()
sys.modules.update(outer)  # and was undone: sys.modules only

sys.path.insert(0, sys.argv[1])
from flashcheck.scenario import Scenario, Step
from flashcheck.session import run_scenario

steps = (Step("capture", (1, 1), (5, 17), bucket=2), Step("replay", (1,), (9,), bucket=2))
results = run_scenario(Scenario("faulty_targets:PlanInfoVaries", steps), device="cpu", layers="off")
print(" ".join(sorted({f.id for r in results for f in r.findings})))
"""


def test_properties_run_after_an_in_process_pytest_run_undid_its_imports() -> None:
    """The driver imported again takes the catalogue imported again (not the package's stale attribute, whose
    properties declare the phases of a `Phase` class the new driver does not use: none ran)."""
    cmd = [sys.executable, "-c", AFTER_AN_IN_PROCESS_RUN, QUALITY]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["FC304"], out.stderr[-2000:]
