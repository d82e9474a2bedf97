"""Each seed-bug target (tests/quality/seed_bugs_gpu.py) is flagged on a real GPU by its intended property, with a
stack pointing at the offending line where the property is an event."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.session import open_session
from tests.quality.seed_bugs_gpu import SEED_BUG_TARGETS

BUDGET = 60


@pytest.mark.parametrize("name", sorted(SEED_BUG_TARGETS))
def test_seed_bug_is_found_by_its_property(name: str) -> None:
    cls = SEED_BUG_TARGETS[name]
    target = cls()
    steps = random_steps(target.capacity, BUDGET, seed=99)
    hit = None
    with open_session(target, layers="all", seed=5) as drv:
        for i, s in enumerate(steps):
            r = drv.execute(s, i)
            mine = [f for f in r.findings if f.id == cls.intended]
            if mine:
                hit = mine[0]
                break
    assert hit is not None, f"{name}: {cls.intended} not raised within {BUDGET} steps"
    if cls.intended == "FC201" and name.startswith("seed000"):
        # the finding points at the offending line of the target, not at flashcheck or torch
        src = Path(inspect.getsourcefile(cls) or "")
        assert hit.location.file == str(src), hit.location
        assert "SEED BUG" in src.read_text().splitlines()[(hit.location.line or 0) - 1]
