"""benchmarks/static_recall.py keeps each run compact: totals by held-out batch and by rule, and only the fixtures
with something to show; the page renders from that alone and a compact run is kept as it is."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _recall() -> ModuleType:
    spec = importlib.util.spec_from_file_location("static_recall_benchmark", ROOT / "benchmarks" / "static_recall.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(fixture: str, rule: str, expect: int, hit: int, ok: int, fp: int, missed: list[str]) -> dict[str, Any]:
    return {
        "fixture": fixture,
        "per_rule": {rule: {"expect": expect, "hit": hit, "ok": ok, "false_positive": fp}},
        "missed": missed,
        "false_positives": [f"{fixture}/x.py:1 {rule}"] * fp,
        "dropped_config_keys": [],
        "internal_errors": [],
    }


def test_compact_keeps_batch_and_rule_totals_and_only_the_rows_with_a_miss_or_a_flag() -> None:
    m = _recall()
    first, second = next(iter(m.HELDOUT_BATCHES.values()))[0], list(m.HELDOUT_BATCHES.values())[1][0]
    rows = [
        _row("fc101_spellings.py", "FC101", 3, 3, 2, 0, []),
        _row(f"static_heldout/{first}", "FC101", 4, 3, 5, 0, ["a.py:3 FC101"]),
        _row(f"static_heldout/{second}", "FC104", 2, 2, 3, 1, []),
    ]
    run = {"label": "x", "command": "c", "date": "d", "python": "3", "commit": "abc", "fixtures": rows}
    run.update(all_fixtures=m.totals(rows[:1]), engine_fixtures=m.totals([]), heldout=m.totals(rows[1:]))
    out = m.compact(run)
    assert [r["fixture"] for r in out["fixtures"]] == [rows[1]["fixture"], rows[2]["fixture"]]
    first_batch, second_batch = list(m.HELDOUT_BATCHES)[:2]
    assert out["batches"][first_batch] == m.totals(rows[1:2])
    assert out["batches"][second_batch] == m.totals(rows[2:3])
    assert out["per_rule"]["all_fixtures"] == {"FC101": {"expect": 3, "hit": 3, "ok": 2, "false_positive": 0}}
    assert out["per_rule"]["heldout"]["FC104"]["false_positive"] == 1
    assert m.compact(out) is out
    page = m.render({"runs": {"x": out}})
    assert "`static_heldout/" + first + "/a.py:3 FC101`" in page
    assert "Flagged near misses (1)" in page
