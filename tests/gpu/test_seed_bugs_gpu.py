"""Each seed-bug target (tests/quality/seed_bugs_gpu.py) is flagged on a real GPU by its intended property, with a
stack pointing at the offending line where the property is an event."""

from __future__ import annotations

import inspect

import pytest

from flashcheck.fuzz.scenarios import random_steps
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
    if hit.kind == "runtime" and hit.stack:
        src = inspect.getsourcefile(cls)
        lines = [fr for fr in hit.stack if fr.file == src]
        if cls.intended == "FC201" and name.startswith("seed000"):
            assert lines and "SEED BUG" in lines[-1].code + open(src).read().splitlines()[lines[-1].line - 1]
