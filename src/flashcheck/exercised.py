"""What a run actually exercised of the checks it selected: a verdict is a promise, and "clean" names only checks
that ran on real observations and found nothing.

A run's ``run.json`` lists the checks it *selected* (``"checks"``: what its configuration runs, `driver.checks_run`)
and, per target, what it *exercised* (``"checks_by_target"``)::

    "checks_by_target": {
      "cpu-reference": {
        "exercised": ["FC201", "FC250", "FC301", ...],
        "not_applicable": {"FC202": "no active detection layer sees it here (gpu_trace: no CUDA device)"}
      }
    }

A check is *exercised* when it was evaluated on something the run observed: a property when the driver ran it on a
phase's observation, FC302 when an arena scan covered a workspace, FC250 when the target was called, FC252 when a
step ran under the armed watchdog, FC251 when a campaign worker ran under its supervisor, a runtime detector when a
region it watches was opened while a detection layer that reports its events was active (`Checker.exercised`).

A check is *not applicable* when by design it cannot apply to this target here, with the reason: a property of the
replay phase on a target that captures no graphs, FC302 on a target that holds no arena workspace, a runtime detector
none of whose detection layers can run in this environment. A selected check that is neither (it should have run and
did not: no step reached its phase, no region of its kind opened) is *not exercised*, and the run is not clean
(`flashcheck.reports.model.ReportView.incomplete_reasons`).

Sessions of one target (a restarted worker, a campaign's jobs) merge: a check exercised by any of them is exercised.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHECKS_BY_TARGET", "Exercised", "add_exercised", "merge_by_target", "read_checks_by_target"]

CHECKS_BY_TARGET = "checks_by_target"  # the run.json key


@dataclass
class Exercised:
    """The checks one session (or every session of one target) exercised, and those that cannot apply, with why."""

    exercised: set[str] = field(default_factory=set)
    not_applicable: dict[str, str] = field(default_factory=dict)

    def mark(self, *ids: str) -> None:
        """`ids` ran on a real observation."""
        self.exercised.update(ids)

    def cannot_apply(self, check_id: str, why: str) -> None:
        """`check_id` cannot apply to this target here, because `why` (first reason kept; a check also exercised
        stays exercised: `merged` and `to_dict` drop it from here)."""
        self.not_applicable.setdefault(check_id, why)

    def merged(self, *others: Exercised) -> Exercised:
        """This and `others` as one: exercised by any; not applicable where none exercised it (first reason kept)."""
        out = Exercised(set(self.exercised), dict(self.not_applicable))
        for o in others:
            out.exercised |= o.exercised
            for cid, why in o.not_applicable.items():
                out.not_applicable.setdefault(cid, why)
        out.not_applicable = {c: w for c, w in sorted(out.not_applicable.items()) if c not in out.exercised}
        return out

    def to_dict(self) -> dict[str, Any]:
        na = {c: w for c, w in sorted(self.not_applicable.items()) if c not in self.exercised}
        return {"exercised": sorted(self.exercised), "not_applicable": na}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Exercised:
        d = d if isinstance(d, Mapping) else {}
        ex = d.get("exercised")
        na = d.get("not_applicable")
        return cls(
            {str(c) for c in ex} if isinstance(ex, list) else set(),
            {str(k): str(v) for k, v in na.items()} if isinstance(na, Mapping) else {},
        )

    def __bool__(self) -> bool:
        """Whether anything was recorded at all."""
        return bool(self.exercised or self.not_applicable)


def merge_by_target(*maps: Mapping[str, Exercised]) -> dict[str, Exercised]:
    """Per-target records of several sessions as one (`Exercised.merged` per target), targets sorted by name."""
    out: dict[str, Exercised] = {}
    for m in maps:
        for target, ex in m.items():
            out[target] = out[target].merged(ex) if target in out else Exercised().merged(ex)
    return dict(sorted(out.items()))


def add_exercised(meta: dict[str, Any], by_target: Mapping[str, Exercised]) -> None:
    """Merge per-target records into a run's metadata (``run.json`` ``"checks_by_target"``), keeping what it holds
    (a resumed run, earlier jobs of a campaign)."""
    merged = merge_by_target(read_checks_by_target(meta) or {}, by_target)
    meta[CHECKS_BY_TARGET] = {t: ex.to_dict() for t, ex in merged.items()}


def read_checks_by_target(meta: Mapping[str, Any]) -> dict[str, Exercised] | None:
    """The per-target records of a run's metadata; None for a run written before flashcheck recorded them."""
    raw = meta.get(CHECKS_BY_TARGET)
    if not isinstance(raw, Mapping):
        return None
    return {str(t): Exercised.from_dict(d) for t, d in raw.items()}
