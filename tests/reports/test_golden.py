"""Golden outputs: every renderer over the synthetic run, then over the same run against a baseline, one golden
file per format.

Regenerate after an intended change with ``FLASHCHECK_UPDATE_GOLDEN=1 pytest tests/reports`` and review the diff
of ``tests/reports/golden/`` like code.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from flashcheck.reports import FORMATS, SUFFIXES, check_format, render
from flashcheck.rundir import load_run

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("FLASHCHECK_UPDATE_GOLDEN") == "1"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if not path.exists():
        pytest.fail(f"golden file {path} is missing; create it with FLASHCHECK_UPDATE_GOLDEN=1 pytest tests/reports")
    want = path.read_text(encoding="utf-8")
    if text != want:
        diff = "".join(
            difflib.unified_diff(want.splitlines(True), text.splitlines(True), f"golden/{name}", "rendered", n=2)
        )
        pytest.fail(f"{name} differs from its golden file (FLASHCHECK_UPDATE_GOLDEN=1 regenerates it):\n{diff[:6000]}")


# between a format's rendering of the run and its rendering against the baseline, in the format's golden file
COMPARE_MARK = "\n======== the same run with --compare against the baseline ========\n\n"


@pytest.mark.parametrize("fmt", FORMATS)
def test_golden(fmt: str, run_dir: Path, baseline_dir: Path) -> None:
    result = load_run(run_dir)
    plain = render(result, fmt, run_dir=run_dir)
    compare = render(result, fmt, run_dir=run_dir, baseline=load_run(baseline_dir))
    check_golden(f"{fmt}{SUFFIXES[check_format(fmt)]}", plain + COMPARE_MARK + compare)


def test_golden_clean_run_terminal(clean_run_dir: Path) -> None:
    check_golden("terminal-clean.txt", render(load_run(clean_run_dir), "terminal"))


@pytest.mark.parametrize("fmt", ["terminal", "concise", "markdown", "junit"])
def test_golden_run_with_a_check_not_exercised(fmt: str, recorded_clean_run_dir: Path) -> None:
    text = render(load_run(recorded_clean_run_dir), fmt)
    check_golden(f"not-exercised-{fmt}{SUFFIXES[check_format(fmt)]}", text)


def test_rendering_is_deterministic(run_dir: Path, baseline_dir: Path) -> None:
    result, base = load_run(run_dir), load_run(baseline_dir)
    for fmt in FORMATS:
        assert render(result, fmt, baseline=base) == render(result, fmt, baseline=base), fmt
