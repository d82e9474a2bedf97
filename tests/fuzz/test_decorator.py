"""The public decorator and the import-light package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import faulty_targets as ft
import pytest

import flashcheck
from flashcheck.errors import InvalidDefinition
from flashcheck.fuzzing.options import FuzzOptions, set_active_options
from flashcheck.fuzzing.stateful import FuzzFailure
from tests.conftest import PLANTED_BUG_LAYERS

SRC = str(Path(__file__).resolve().parents[2] / "src")
SMALL = {"max_kv_len": 256, "chunk": 32, "max_pages": 256}


def test_import_flashcheck_imports_neither_torch_nor_hypothesis() -> None:
    code = (
        "import sys, flashcheck, flashcheck.fuzzing, flashcheck.pytest_plugin; f = flashcheck.fuzz; "
        "print(sorted(m for m in ('torch', 'hypothesis', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": SRC, "PATH": ""}
    ).stdout
    assert out.strip() == "[]"


def test_fuzz_is_the_decorator_after_submodule_imports() -> None:
    import flashcheck.fuzzing.strategies  # the package has its own name: flashcheck.fuzz stays the decorator

    dec = flashcheck.fuzz(target="cpu-reference", budget=2)
    assert callable(dec)
    assert flashcheck.fuzzing.strategies.batch_specs is not None


@pytest.mark.slow
def test_decorated_test_finds_a_faulty_target_and_calls_the_step_property(tmp_path: Path) -> None:
    calls: list[str] = []

    @flashcheck.fuzz(
        target="faulty_targets:PlanInfoVaries", config=SMALL, budget=40, seed=0, device="cpu", layers=PLANTED_BUG_LAYERS
    )
    def test_faulty(step: object, result: object) -> None:
        calls.append(type(step).__name__)

    assert test_faulty.__name__ == "test_faulty"
    previous = set_active_options(FuzzOptions(profile="ci", out_dir=tmp_path))
    try:
        with pytest.raises(FuzzFailure) as info:
            test_faulty()
    finally:
        set_active_options(previous)
    assert {f.id for f in info.value.findings} == {"FC304"}
    assert calls and set(calls) == {"Step"}
    assert any("flashcheck: seed 0" in n for n in getattr(info.value, "__notes__", []))
    assert list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("how", ["instance", "factory"])
def test_decorated_clean_target_passes_with_instance_and_factory(how: str) -> None:
    target = ft.ReferenceTarget(**SMALL) if how == "instance" else (lambda: ft.ReferenceTarget(**SMALL))
    results: list[object] = []

    @flashcheck.fuzz(target=target, budget=5, seed=1, device="cpu", profile="ci")
    def test_clean(step: object, result: object) -> None:
        results.append(result)

    test_clean()  # returns: no finding on the reference target
    ran = [r for r in results if r.sample is not None]  # type: ignore[attr-defined]
    assert ran and all(r.findings == [] for r in results)  # type: ignore[attr-defined]


def test_decorator_rejects_other_signatures() -> None:
    with pytest.raises(InvalidDefinition, match="takes none"):

        @flashcheck.fuzz(target="cpu-reference")
        def test_bad(x: object) -> None:
            pass


def test_budget_option_overrides_and_target_option_fills_in(tmp_path: Path) -> None:
    from flashcheck.fuzzing.options import Budget

    @flashcheck.fuzz(budget=500, device="cpu", seed=2)
    def test_default_target() -> None:
        pass

    previous = set_active_options(
        FuzzOptions(target="faulty_targets:PlanInfoVaries", budget=Budget(examples=30), profile="ci")
    )
    try:
        r = test_default_target.fuzz_test.resolve()  # type: ignore[attr-defined]
        assert r["target"] == "faulty_targets:PlanInfoVaries" and r["budget"] == Budget(examples=30)
    finally:
        set_active_options(previous)
