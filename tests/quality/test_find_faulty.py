"""Quality: the replay state machine must find each planted bug within a small budget, shrink it to a short
program, and stay quiet on the clean reference target. Seeds are fixed (and printed on failure)."""

from __future__ import annotations

import re
from pathlib import Path

import faulty_targets as ft
import pytest

from flashcheck.fuzzing.recorder import FindingLog
from flashcheck.fuzzing.stateful import FuzzFailure, fuzz_target
from flashcheck.targets.reference import ReferenceTarget
from tests.conftest import STALE_LAST_PAGE_LEN, fuzz_planted_bug

SMALL = {"max_kv_len": 256, "chunk": 32, "max_pages": 256}


@pytest.mark.parametrize(
    ("cls", "check_id"),
    [
        pytest.param(ft.StaleLastPageLen, "FC303", marks=STALE_LAST_PAGE_LEN),
        (ft.PollutedIndptr, "FC301"),
        (ft.PlanInfoVaries, "FC304"),
    ],
)
@pytest.mark.slow
def test_finds_planted_bug_and_shrinks(
    cls: type[ReferenceTarget], check_id: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if cls is ft.StaleLastPageLen:  # the same run (seed 1, 60 examples) test_repro_replay.py replays: run once
        exc = request.getfixturevalue("stale_last_page_len_failure")
        log_dir = exc.log_dir
    else:
        log_dir = tmp_path
        exc = fuzz_planted_bug(cls(**SMALL), log_dir)
    assert check_id in {f.id for f in exc.findings}, f"seed 1: {[str(f) for f in exc.findings]}"
    program = [n for n in getattr(exc, "__notes__", []) if n.startswith("state.") and "teardown" not in n]
    assert 2 <= len(program) <= 4, "\n".join(program)  # capture + the replays that expose it
    rec = next(r for r in exc.records if r.finding.id == check_id)
    assert rec.path is not None and rec.path.parent == log_dir
    # the reproducer holds the shrunk scenario, cut after the failing step: one step per rule, plus a replay burst's
    # `more` batches, plus at most one implicit capture of a new bucket
    bursts = sum(int(m) for line in program for m in re.findall(r"\bmore=(\d+)", line))
    assert len(rec.repro["scenario"]["steps"]) == rec.repro["step"] + 1 <= len(program) + bursts + 1


@pytest.mark.slow
def test_clean_reference_target_stays_quiet() -> None:
    report = fuzz_target(ReferenceTarget(**SMALL), budget=25, seed=2, profile="ci", device="cpu", database=None)
    assert report.rounds == 1 and report.target == "cpu-reference"


@pytest.mark.slow
def test_reset_session_finds_it_too(tmp_path: Path) -> None:
    with pytest.raises(FuzzFailure) as info:
        fuzz_target(
            ft.PlanInfoVaries(**SMALL),
            budget=30,
            seed=3,
            profile="ci",
            device="cpu",
            database=None,
            reset="session",
            log=FindingLog(tmp_path),
            shrink_seconds=0,  # the first failure is the point here; shrinking is the test above's
        )
    assert {f.id for f in info.value.findings} == {"FC304"}
    assert info.value.records[0].path is not None and info.value.records[0].path.is_file()
