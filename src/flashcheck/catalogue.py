"""Every check flashcheck has: the modules that define them, one line each, and lookups by ID or name.

A check module defines its `Check` (and, for a property, one `Property` per phase it runs in); adding a check is
its module and its line in `CHECK_MODULES` (static rules: their line in `flashcheck.verifier.rules.RULES`). The
driver runs the `PROPERTIES` of each phase in the order listed here; `flashcheck rules` and the reports' check
pages read `CHECKS`. None of these modules imports torch.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from flashcheck import watchdog
from flashcheck.campaign import checks as campaign_checks
from flashcheck.check import Check
from flashcheck.errors import InvalidArgument, InvalidDefinition
from flashcheck.properties import csr, equivalence, output_contract, plan_info, workspace_size
from flashcheck.properties.phases import Phase, Property
from flashcheck.runtime.checks import allocation, host_sync, pinned_copy, staging, workspace
from flashcheck.targets import classify
from flashcheck.verifier.rules import RULES

__all__ = ["CHECKS", "CHECK_MODULES", "PROPERTIES", "all_checks", "get_check", "properties"]

# Runtime detectors and properties, one module per check. Properties of one phase run in this order.
CHECK_MODULES: tuple[ModuleType, ...] = (
    host_sync,  # FC201
    allocation,  # FC202
    pinned_copy,  # FC203
    staging,  # FC204
    classify,  # FC250
    campaign_checks,  # FC251
    watchdog,  # FC252
    plan_info,  # FC304 (before replay: listed before FC301 so that its findings come first)
    csr,  # FC301
    workspace,  # FC302
    equivalence,  # FC303
    output_contract,  # FC305
    workspace_size,  # FC306 (flashcheck workspace; no driver phase)
)


def _module_checks(module: ModuleType) -> list[Check]:
    return [v for v in vars(module).values() if isinstance(v, Check)]


def _module_properties(module: ModuleType) -> list[Property[Any]]:
    return [v for v in vars(module).values() if isinstance(v, Property)]


def _collect() -> tuple[Check, ...]:
    """Every check of the listed modules once (a module may import another's `Check`); two checks of one ID fail."""
    found = [c for m in CHECK_MODULES for c in _module_checks(m)] + [r.CHECK for r in RULES]
    by_id: dict[str, Check] = {}
    for c in found:
        if by_id.setdefault(c.id, c) is not c:
            raise InvalidDefinition(f"check ID {c.id} is defined twice: {by_id[c.id].name!r} and {c.name!r}")
    return tuple(sorted(by_id.values(), key=lambda c: c.id))


CHECKS: tuple[Check, ...] = _collect()
# a module that imports another's check or property names the same object: each counts once
PROPERTIES: tuple[Property[Any], ...] = tuple({id(p): p for m in CHECK_MODULES for p in _module_properties(m)}.values())


def properties(phase: Phase) -> tuple[Property[Any], ...]:
    """The properties that run in `phase`, in catalogue order. Every phase has some: none means the caller's `Phase`
    is not this catalogue's (a module imported twice), and a step checked by nothing must fail, never pass clean."""
    found = tuple(p for p in PROPERTIES if p.phase is phase)
    if not found:
        raise RuntimeError(
            f"flashcheck internal error: no property runs in phase {phase!r}; the catalogue's phases are "
            f"{sorted({p.phase.value for p in PROPERTIES})} (a flashcheck module imported twice?)"
        )
    return found


def all_checks() -> list[Check]:
    """Every check, sorted by ID."""
    return list(CHECKS)


def get_check(id_or_name: str) -> Check:
    """Look a check up by ID (``FC301``) or name (``csr-well-formed``)."""
    key = id_or_name.strip()
    for c in CHECKS:
        if c.id == key.upper() or c.name == key:
            return c
    known = ", ".join(c.id for c in CHECKS)
    raise InvalidArgument(f"unknown check {id_or_name!r}; known checks: {known}")
