"""reports/verdicts.md is generated from reports/raw: re-rendering it from the committed raw results changes
nothing (no figure in it is typed by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_verdicts_report_regenerates_from_raw_results() -> None:
    spec = importlib.util.spec_from_file_location("verdicts_benchmark", ROOT / "benchmarks" / "verdicts.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.render(ROOT / "reports" / "raw") == (ROOT / "reports" / "verdicts.md").read_text()
