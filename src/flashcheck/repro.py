"""Reproducers: a finding plus the scenario that led to it, as JSON; re-run deterministically; pytest snippets.

Repro JSON (schema `REPRO_SCHEMA`)::

    {"schema": 1, "scenario": Scenario.to_dict(), "step": N, "layers": "all", "finding": Finding.to_dict(),
     "environment": {...}, "command": "...", "sys_path": [...]}

A custom target is recorded as ``"module:Class"`` (see `flashcheck.targets.registry`); ``sys_path`` lists the
directory its module was imported from, added to ``sys.path`` on replay when the module is not importable otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding, atomic_write_text
from flashcheck.rundir import environment
from flashcheck.scenario import Scenario

__all__ = ["REPRO_SCHEMA", "load_repro", "make_repro", "pytest_snippet", "replay_repro", "save_repro"]

REPRO_SCHEMA = 1


def make_repro(
    scenario: Scenario,
    step: int,
    finding: Finding,
    *,
    layers: str = "all",
    async_pressure_us: float | None = None,
) -> dict[str, Any]:
    """The scenario truncated after the failing step, and the finding it must reproduce (with the async pressure it
    was found under: a staging race may show only with the stream busy)."""
    trimmed = Scenario(scenario.target, scenario.steps[: step + 1], scenario.seed, scenario.target_config)
    doc: dict[str, Any] = {
        "schema": REPRO_SCHEMA,
        "scenario": trimmed.to_dict(),
        "step": step,
        "layers": layers,
        "finding": finding.to_dict(),
        "environment": environment(),
    }
    if async_pressure_us:
        doc["async_pressure_us"] = async_pressure_us
    root = _module_root(scenario.target)
    if root is not None:
        doc["sys_path"] = [root]
    return doc


def _module_root(spec: str) -> str | None:
    """For ``"pkg.mod:Class"``: the sys.path entry ``pkg.mod`` was imported from (None for built-in names)."""
    if ":" not in spec:
        return None
    module = spec.partition(":")[0]
    mod = sys.modules.get(module)
    path = getattr(mod, "__file__", None)
    if not path:
        return None
    root = Path(path).resolve().parent
    for _ in range(module.count(".") + (1 if Path(path).name == "__init__.py" else 0)):
        root = root.parent
    return str(root)


def _extend_sys_path(repro: Mapping[str, Any]) -> None:
    spec = str(repro.get("scenario", {}).get("target", ""))
    if ":" not in spec:
        return
    module = spec.partition(":")[0]
    try:
        if importlib.util.find_spec(module) is not None:
            return
    except (ImportError, ValueError):
        pass
    for entry in repro.get("sys_path", []):
        if os.path.isdir(entry) and entry not in sys.path:
            sys.path.insert(0, entry)


def save_repro(path: str | os.PathLike[str], repro: Mapping[str, Any]) -> Path:
    p = Path(path)
    atomic_write_text(p, json.dumps(repro, indent=2, sort_keys=True, default=str) + "\n")
    return p


def load_repro(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The reproducer document at `path`; `InvalidArgument` (one line) for anything that is not one."""
    p = Path(path)
    if p.is_dir():
        found = sorted(p.glob("repros/*.json")) or sorted(p.glob("*.json"))
        hint = f" such as {found[0]}" if found else " (a run directory keeps them in repros/)"
        raise InvalidArgument(f"{path} is a directory; pass one reproducer file{hint}")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidArgument(f"reproducer {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"reproducer {path} cannot be read ({exc}); pass a reproducer JSON file") from None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"reproducer {path} is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or "scenario" not in doc or "step" not in doc:
        raise InvalidArgument(f"{path} is not a flashcheck reproducer (needs 'scenario' and 'step')")
    if int(doc.get("schema", 1)) > REPRO_SCHEMA:
        raise InvalidArgument(f"reproducer schema {doc['schema']} is newer than this flashcheck; upgrade")
    return doc


def replay_repro(
    repro: Mapping[str, Any], *, device: str | None = None, isolate: bool | None = None
) -> tuple[list[Finding], bool]:
    """Re-run the scenario up to the failing step in a fresh session.

    A reproducer of a fault or a hang (FC250 that poisoned the context, FC251, FC252) runs in an isolated worker
    process with the step watchdog, so it comes back as the same finding instead of hanging or killing the caller;
    `isolate` forces either way (``FLASHCHECK_REPLAY_IN_PROCESS=1``: never, as under compute-sanitizer).

    Returns the findings at the failing step and whether the recorded finding (same check ID and sub-check)
    reappeared.
    """
    from flashcheck.session import run_scenario

    _extend_sys_path(repro)
    scenario = Scenario.from_dict(repro["scenario"])
    step = int(repro["step"])
    want = repro.get("finding") or {}
    layers = repro.get("layers", "all")
    pressure = repro.get("async_pressure_us")
    if isolate is None:
        from flashcheck.campaign.checks import WORKER_CRASHED
        from flashcheck.targets.classify import TARGET_RAISED
        from flashcheck.watchdog import STEP_HUNG

        crashers = {c.id for c in (TARGET_RAISED, WORKER_CRASHED, STEP_HUNG)}
        isolate = want.get("id") in crashers and os.environ.get("FLASHCHECK_REPLAY_IN_PROCESS") != "1"
    if isolate and (":" not in scenario.target or _module_importable(scenario.target)):
        from flashcheck.isolation import IsolatedDriver
        from flashcheck.watchdog import default_step_timeout

        timeout = float(want.get("evidence", {}).get("timeout_s") or default_step_timeout("cuda") or 120.0)
        with IsolatedDriver(
            scenario.target,
            config=scenario.target_config,
            device=device,
            layers=layers,
            seed=scenario.seed,
            step_timeout=timeout,
            warm_up_scale=2.0,  # the recorded timeout, with room for a first JIT load, not the 5x search leash
            async_pressure_us=pressure,
        ) as drv:
            results = [drv.execute(s, i) for i, s in enumerate(scenario.steps[: step + 1])]
    else:
        results = run_scenario(scenario, device=device, layers=layers, stop_at=step, async_pressure_us=pressure)
    found = results[step].findings if len(results) > step else []
    hit = any(
        f.id == want.get("id") and f.evidence.get("check") == want.get("evidence", {}).get("check") for f in found
    )
    return found, hit


def _module_importable(spec: str) -> bool:
    try:
        return importlib.util.find_spec(spec.partition(":")[0]) is not None
    except (ImportError, ValueError):
        return False


def pytest_snippet(repro: Mapping[str, Any], path: str = "repro.json") -> str:
    """A test a user can paste: it fails while the bug is there."""
    f = repro.get("finding", {})
    return (
        "from flashcheck.repro import load_repro, replay_repro\n\n\n"
        f"def test_{str(f.get('name', 'finding')).replace('-', '_')}_does_not_come_back():\n"
        f"    # {f.get('id', '')} {f.get('name', '')}: {str(f.get('message', ''))[:100]}\n"
        f"    findings, reproduced = replay_repro(load_repro({path!r}))\n"
        "    assert not reproduced, '\\n'.join(map(str, findings))\n"
    )
