"""The CPU parts of the oracle's GPU confirmation: which bound each arena workspace is held to, and the report
rendered from raw results (a synthetic one here; the real ones come from benchmarks/workspace_oracle.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from flashcheck.workspace import preset, run_oracle
from flashcheck.workspace.confirm import _bound_for

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "workspace_oracle_benchmark", ROOT / "benchmarks" / "workspace_oracle.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_arena_workspace_is_held_to_its_own_use() -> None:
    bounds = [b for b in run_oracle(preset("decode-tc")).bounds if b.rules == "0.6"]
    by_use = {(b.use, b.kind): b.bound for b in bounds}
    assert _bound_for("int_workspace[graph bs=8]", bounds) == by_use[("decode-tc graph bs=8", "int")]
    assert _bound_for("int_workspace[eager]", bounds) == by_use[("decode-tc eager", "int")]
    assert _bound_for("float_workspace", bounds) == max(b for (_, k), b in by_use.items() if k == "float")
    assert _bound_for("kv_cache", bounds) is None


def test_render_marks_a_bound_exceeded_and_a_loose_witness() -> None:
    doc = {
        "command": "python benchmarks/workspace_oracle.py",
        "date": "2026-01-01",
        "environment": {"flashinfer": "0.6.13", "device": "H100"},
        "witnesses": [
            {
                "what": "witnesses x",
                "status": "ran",
                "result": [
                    {"config": "x", "use": "prefill-fa2 eager", "bound": 100, "searched": 100, "witness": "w",
                     "high_water": 90, "overflows_below_need": False, "status": "MISMATCH"},
                ],
            }
        ],
        "fuzz": [
            {"what": "fuzz t", "status": "ran", "result": {"target": "t", "steps": 200, "workspaces": [
                {"workspace": "float_workspace", "high_water": 120, "bound": 100, "within": False}]}},
        ],
        "replays": [{"what": "replay", "status": "error", "result": {"error": "RuntimeError: no GPU"}}],
    }  # fmt: skip
    text = _bench().render_one(doc)
    assert "**runs: bound not tight**" in text and "| t | 200 | float_workspace | 120 | 100 | **NO** |" in text
    assert "error RuntimeError: no GPU" in text
