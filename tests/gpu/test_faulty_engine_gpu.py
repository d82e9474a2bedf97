"""Each faulty engine target (tests/quality/faulty_engine_gpu.py) is found on a real GPU by one of its accepted
checks: never skipped as rejected, never "environment". Each runs in an isolated worker, so a kernel fault or a
hang ends that worker, not this test process."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

import pytest

from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.isolation import IsolatedDriver
from flashcheck.known import split_known

QUALITY = Path(__file__).resolve().parents[1] / "quality"
sys.path.insert(0, str(QUALITY))
from faulty_engine_gpu import FAULTY_ENGINE_TARGETS  # noqa: E402

BUDGET = int(os.environ.get("FLASHCHECK_GPU_STEPS", "60"))


@pytest.mark.parametrize("name", sorted(FAULTY_ENGINE_TARGETS))
def test_faulty_engine_target_is_found(name: str) -> None:
    cls, accepted = FAULTY_ENGINE_TARGETS[name]
    hit = None
    with IsolatedDriver(
        f"faulty_engine_gpu:{cls.__name__}", device="cuda", layers="cheap", seed=5, step_timeout=30.0
    ) as drv:
        for i, s in enumerate(random_steps(drv.cap, BUDGET, seed=99)):
            r = drv.execute(s, i)
            assert r.rejected is None, f"{name}: step {i} rejected: {r.rejected}"
            unexpected, _ = split_known(r.findings, drv.target.name)
            mine = [f for f in unexpected if f.id in accepted]
            if mine:
                hit = mine[0]
                break
    assert hit is not None, f"{name}: none of {accepted} within {BUDGET} steps"
    if hit.id == "FC201":  # the finding points at the target's offending line
        src = Path(inspect.getsourcefile(cls) or "")
        assert hit.location.file == str(src), hit.location
        assert "BUG" in src.read_text().splitlines()[(hit.location.line or 0) - 1]
