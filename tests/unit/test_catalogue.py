"""The catalogue lists every module that defines a check, so a check whose catalogue line was forgotten fails here
instead of silently never running; every check it lists is complete and looked up the same way everywhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import flashcheck
from flashcheck import catalogue
from flashcheck.driver import checks_run
from flashcheck.errors import InvalidArgument
from flashcheck.properties.phases import Phase
from flashcheck.verifier.rules import RULES

SRC = Path(flashcheck.__file__).parent


def _module_name(path: Path) -> str:
    return ".".join(("flashcheck", *path.relative_to(SRC).with_suffix("").parts))


def _defines(path: Path) -> tuple[bool, bool]:
    """(defines a `Check` at module level, declares a static rule with `@rule(...)`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    check = rule = False
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
            check |= isinstance(node.value.func, ast.Name) and node.value.func.id == "Check"
        if isinstance(node, ast.ClassDef):
            rule |= any(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "rule"
                for d in node.decorator_list
            )
    return check, rule


def _modules_defining() -> tuple[set[str], set[str]]:
    checks, rules = set(), set()
    for path in sorted(SRC.rglob("*.py")):
        check, rule = _defines(path)
        if check:
            checks.add(_module_name(path))
        if rule:
            rules.add(_module_name(path))
    return checks, rules


def test_every_module_that_defines_a_check_is_in_the_catalogue() -> None:
    checks, rules = _modules_defining()
    assert checks, "no module defines a Check: the scan is broken"
    listed = {m.__name__ for m in catalogue.CHECK_MODULES}
    assert checks - listed == set(), "add these modules to flashcheck.catalogue.CHECK_MODULES"
    assert listed - checks == set(), "catalogue modules that define no check"
    listed_rules = {r.__module__ for r in RULES}
    assert rules - listed_rules == set(), "add these rules to flashcheck.verifier.rules.RULES"


def test_every_check_has_one_id_and_one_object() -> None:
    ids = [c.id for c in catalogue.CHECKS]
    names = [c.name for c in catalogue.CHECKS]
    assert len(ids) == len(set(ids)) and len(names) == len(set(names))
    assert all(catalogue.get_check(c.id) is c and catalogue.get_check(c.name) is c for c in catalogue.CHECKS)
    with pytest.raises(InvalidArgument, match="unknown check 'FC398'"):
        catalogue.get_check("FC398")


def test_properties_are_catalogued_checks_and_every_phase_runs_one() -> None:
    assert {p.check for p in catalogue.PROPERTIES} <= set(catalogue.CHECKS)
    assert all(p.check.kind == "property" for p in catalogue.PROPERTIES)
    assert all(catalogue.properties(phase) for phase in Phase)


def test_a_phase_no_property_answers_is_an_error_not_a_clean_step() -> None:
    import enum

    class Stale(enum.Enum):  # the Phase of a catalogue imported a second time: equal values, another class
        BEFORE_REPLAY = Phase.BEFORE_REPLAY.value

    message = "no property runs in phase <Stale.BEFORE_REPLAY: 'before-replay'>"
    with pytest.raises(RuntimeError, match=re.escape(message)):
        catalogue.properties(Stale.BEFORE_REPLAY)  # type: ignore[arg-type]


def test_the_checks_a_run_lists_are_catalogued() -> None:
    known = {c.id for c in catalogue.CHECKS}
    full = checks_run("all", watchdog=True, campaign=True)
    assert set(full) <= known
    assert {"FC201", "FC250", "FC251", "FC252", "FC301", "FC302", "FC303", "FC304", "FC305"} <= set(full)
    assert not any(c.startswith("FC2") and c not in ("FC250",) for c in checks_run("off", watchdog=False))
