"""The CPU parts of the oracle's GPU confirmation: which bound each arena workspace is held to, and the report
rendered from raw results (a synthetic one here; the real ones come from benchmarks/workspace_oracle.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

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
                {"workspace": "float_workspace", "high_water": 120, "bound": 100, "within": False}],
                "workspace_size": {"equal": 3, "oracle_larger": 0, "oracle_smaller": 1, "not_comparable": 0,
                                   "examples": [{"batch": "1 x (qo 1, kv 16)"}]}}},
        ],
        "replays": [{"what": "replay", "status": "error", "result": {"error": "RuntimeError: no GPU"}}],
    }  # fmt: skip
    text = _bench().render_one(doc)
    assert "**runs: bound not tight**" in text and "| t | 200 | float_workspace | 120 | 100 | **NO** |" in text
    assert "error RuntimeError: no GPU" in text
    assert "| t | 3 | 0 | 1 | 0 |" in text


def test_plan_arguments_become_the_batch_the_oracle_plans() -> None:
    torch = pytest.importorskip("torch")
    from flashcheck.workspace.confirm import _batch_of, _compare_sizes
    from flashcheck.workspace.oracle import UseSpec, plan_for

    qo = torch.tensor([0, 9, 10], dtype=torch.int32)
    kv = torch.tensor([0, 264, 265], dtype=torch.int32)
    b = _batch_of("prefill", (qo, kv), 16)
    assert b is not None and b.lens() == ((9, 1), (264 * 16, 16))
    d = _batch_of("decode", (kv,), 16)
    assert d is not None and d.lens() == ((1, 1), (264 * 16, 16))
    assert _batch_of("mla", (qo, kv), 1) is None
    cfg = preset("prefill-64h-16mib")
    spec = UseSpec(cfg.wrappers[0], "0.7")
    p = plan_for(cfg, spec, b)
    tally = _compare_sizes(cfg, spec, [([p.float_bytes, p.int_bytes], b), ([p.float_bytes + 1, p.int_bytes], b)])
    assert (tally["equal"], tally["oracle_smaller"], tally["oracle_larger"]) == (1, 1, 0)
    assert tally["examples"][0]["workspace_size"] == [p.float_bytes + 1, p.int_bytes]


class _Sized:
    def plan(self, *a: object) -> str:
        return "planned"

    def workspace_size(self, *a: object) -> tuple[int, int]:
        return (100, 8)


class _Unsized:  # 0.7's MLA wrapper: plans, but offers no workspace_size()
    def plan(self, *a: object) -> str:
        return "planned"


def test_the_size_cross_check_names_a_wrapper_without_workspace_size_instead_of_disagreeing() -> None:
    from types import SimpleNamespace

    from flashcheck.workspace.confirm import _workspace_size_spy

    sizes: list[object] = []
    absent: list[str] = []
    sized = SimpleNamespace(eager=_Sized(), kind="mla")
    _workspace_size_spy(sizes, 1, absent)(sized)
    assert sized.eager.plan() == "planned" and sizes == [([100, 8], None)] and absent == []
    unsized = SimpleNamespace(eager=_Unsized(), kind="mla")
    _workspace_size_spy(sizes, 1, absent)(unsized)
    assert unsized.eager.plan() == "planned" and len(sizes) == 1
    assert absent == ["_Unsized has no workspace_size()"]


def test_render_shows_a_size_not_offered_as_not_compared() -> None:
    rec = {"config": "mla", "use": "mla-fa2 eager", "bound": 100, "searched": 100, "witness": "w", "high_water": 0,
           "overflows_below_need": True, "status": "confirmed", "oracle_plan": [100, 8],
           "workspace_size_absent": "BatchMLAPagedAttentionWrapper has no workspace_size()"}  # fmt: skip
    doc = {
        "command": "python benchmarks/workspace_oracle.py",
        "date": "2026-01-01",
        "environment": {"flashinfer": "0.7.2.post1", "device": "H100"},
        "witnesses": [{"what": "witnesses mla", "status": "ran", "result": [rec]}],
        "fuzz": [],
        "replays": [],
    }
    text = _bench().render_one(doc)
    assert "| | `workspace_size()` | not offered | oracle [100, 8] | | not compared |" in text
    assert "**differs**" not in text
