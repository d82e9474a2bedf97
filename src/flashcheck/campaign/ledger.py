"""The quarantine ledger: known crashers skipped before launch, each entry citing a reason.

A ledger is JSON or TOML with a list of entries under ``quarantine`` (or, in JSON, a bare list)::

    [[quarantine]]
    target = "decode-tc"                       # a target spec or an fnmatch pattern ("*")
    reason = "flashinfer#1234: IMA when every request has kv_len 1"
    step = { op = "replay", batch_size = 3 }    # any of op, batch_size, bucket, qo_lens, kv_lens

    [[quarantine]]
    target = "prefill-fa3"
    reason = "flashinfer#1301"
    scenario = "0f3c9a1b2d4e5f60"               # the scenario_sha of a reproducer (FC251 evidence)

A step entry removes matching steps from every generated scenario; a scenario entry skips a whole corpus scenario.
An entry without a reason is rejected: a waiver nobody can explain is never lifted.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashcheck.errors import InvalidArgument
from flashcheck.scenario import Scenario, Step

__all__ = ["Ledger", "LedgerEntry", "load_ledger", "scenario_sha", "step_shape"]

_STEP_KEYS = ("op", "batch_size", "bucket", "qo_lens", "kv_lens")


def scenario_sha(scenario: Scenario) -> str:
    """A stable 16-hex-digit identity of a scenario (target, configuration, seed and steps)."""
    raw = json.dumps(scenario.to_dict(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def step_shape(step: Step) -> dict[str, Any]:
    """The fields a ledger entry can match, for one step (what FC251 evidence quotes)."""
    return {
        "op": step.op,
        "batch_size": len(step.qo_lens),
        "bucket": step.bucket,
        "qo_lens": list(step.qo_lens),
        "kv_lens": list(step.kv_lens),
    }


@dataclass(frozen=True)
class LedgerEntry:
    target: str
    reason: str
    step: Mapping[str, Any] = field(default_factory=dict)
    scenario: str | None = None

    def matches_target(self, target: str) -> bool:
        return fnmatch.fnmatchcase(target, self.target)

    def matches_step(self, target: str, step: Step) -> bool:
        if not self.step or not self.matches_target(target):
            return False
        shape = step_shape(step)
        return all(shape[k] == (list(v) if isinstance(v, (list, tuple)) else v) for k, v in self.step.items())


@dataclass(frozen=True)
class Ledger:
    entries: tuple[LedgerEntry, ...] = ()
    source: str = ""

    def skip_scenario(self, scenario: Scenario) -> LedgerEntry | None:
        sha = scenario_sha(scenario)
        return next((e for e in self.entries if e.scenario == sha and e.matches_target(scenario.target)), None)

    def filter_steps(self, scenario: Scenario) -> tuple[Scenario, list[str]]:
        """The scenario without quarantined steps, and the reason for every step removed."""
        kept: list[Step] = []
        reasons: list[str] = []
        for s in scenario.steps:
            hit = next((e for e in self.entries if e.matches_step(scenario.target, s)), None)
            if hit is None:
                kept.append(s)
            else:
                reasons.append(hit.reason)
        if not reasons:
            return scenario, []
        return Scenario(scenario.target, tuple(kept), scenario.seed, scenario.target_config), reasons


def _entry(raw: Any, where: str) -> LedgerEntry:
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"{where}: a ledger entry is a table/object, got {raw!r:.80}")
    reason = str(raw.get("reason", "")).strip()
    if not reason:
        raise InvalidArgument(
            f"{where}: ledger entry {dict(raw)!r:.160} has no reason; every quarantine must cite one "
            '(an issue link or why the crash is expected), e.g. reason = "flashinfer#1234"'
        )
    target = raw.get("target")
    if not isinstance(target, str) or not target:
        raise InvalidArgument(f"{where}: ledger entry needs a 'target' (a target spec or a pattern such as '*')")
    step = raw.get("step", {})
    if not isinstance(step, Mapping) or set(step) - set(_STEP_KEYS):
        raise InvalidArgument(f"{where}: 'step' may only match {', '.join(_STEP_KEYS)}; got {step!r:.120}")
    scen = raw.get("scenario")
    if not step and not scen:
        raise InvalidArgument(f"{where}: ledger entry needs 'step' (a shape to skip) or 'scenario' (a scenario_sha)")
    unknown = set(raw) - {"target", "reason", "step", "scenario", "finding", "added", "owner"}
    if unknown:
        raise InvalidArgument(f"{where}: unknown ledger keys {sorted(unknown)}")
    return LedgerEntry(target=target, reason=reason, step=dict(step), scenario=str(scen) if scen else None)


def _toml_module() -> Any:
    for name in ("tomllib", "tomli"):  # tomllib is Python 3.11+; tomli is its backport
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise InvalidArgument("TOML ledgers need Python 3.11+ or `pip install tomli`; or write the ledger as JSON")


def load_ledger(path: str | Path) -> Ledger:
    """Read and validate a JSON or TOML ledger; `InvalidArgument` naming the file and entry on any problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgument(f"ledger {p} cannot be read: {exc}") from exc
    doc: Any
    if p.suffix == ".toml":
        toml = _toml_module()
        try:
            doc = toml.loads(text)
        except toml.TOMLDecodeError as exc:
            raise InvalidArgument(f"ledger {p} is not valid TOML: {exc}") from exc
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"ledger {p} is not valid JSON (name it .toml for TOML): {exc}") from exc
    items: Sequence[Any]
    if isinstance(doc, Mapping):
        items = doc.get("quarantine", [])
    elif isinstance(doc, list):
        items = doc
    else:
        raise InvalidArgument(f"ledger {p}: expected a list of entries under 'quarantine'")
    if not isinstance(items, list):
        raise InvalidArgument(f"ledger {p}: 'quarantine' must be a list of entries")
    return Ledger(tuple(_entry(e, f"ledger {p}, entry {i}") for i, e in enumerate(items)), str(p))
