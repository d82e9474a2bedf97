"""The view every renderer draws from: one run's findings (compared with a baseline when given), grouped by check,
with the run's environment, errors and the per-step statistics the plots need.

Renderers take a `ReportView`, so they agree on grouping, ordering, compare status and rule pages; nothing here
formats text. Building a view never imports torch.
"""

from __future__ import annotations

import enum
import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashcheck.errors import UsageError
from flashcheck.exercised import Exercised, read_checks_by_target
from flashcheck.findings import Finding, Severity
from flashcheck.rundir import RunResult, Sample

__all__ = [
    "MAX_REPRO_CHARS",
    "CheckResult",
    "CheckStatus",
    "Entry",
    "FindingStatus",
    "Group",
    "ReportView",
    "RuleInfo",
    "build_view",
    "evidence_items",
    "fmt_bytes",
    "fmt_seconds",
    "lookup_rule",
]

MAX_REPRO_CHARS = 20_000  # an embedded reproducer larger than this is cut: the file itself stays in the run dir
_SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
_ENV_ORDER = ("device", "cuda", "torch", "flashinfer", "python", "platform", "flashcheck")


class FindingStatus(str, enum.Enum):
    """Where a finding stands against a baseline run (`--compare`), matched by `Finding.signature()`."""

    NEW = "new"
    UNCHANGED = "unchanged"
    FIXED = "fixed"


class CheckStatus(str, enum.Enum):
    """Where one selected check stands on one target (`ReportView.check_results`)."""

    PASSED = "passed"  # exercised on real observations, found nothing
    FAILED = "failed"  # found something
    NOT_EXERCISED = "not exercised"  # should have run and did not: the run is not clean
    NOT_APPLICABLE = "not applicable"  # cannot apply to this target here, by design (`CheckResult.reason` says why)
    UNRECORDED = "unrecorded"  # a run written before flashcheck recorded what it exercised: listed, as it then said


@dataclass(frozen=True)
class CheckResult:
    """One selected check on one target that ran."""

    id: str
    name: str
    target: str
    status: CheckStatus
    reason: str = ""


@dataclass(frozen=True)
class RuleInfo:
    """What a report says about a check: its catalogue page when catalogued, else what the finding itself says."""

    id: str
    name: str
    kind: str
    summary: str
    doc: str
    docs: str
    registered: bool


def lookup_rule(finding: Finding) -> RuleInfo:
    """The catalogue page of `finding.id`; a check this flashcheck does not know still gets a usable rule."""
    from flashcheck.catalogue import get_check

    try:
        info = get_check(finding.id)
    except UsageError:
        return RuleInfo(finding.id, finding.name, finding.kind, finding.name, "", finding.docs, False)
    return RuleInfo(info.id, info.name, info.kind, info.summary, info.doc, finding.docs, True)


def _check_name(cid: str) -> str:
    """The catalogue name of check `cid` (empty for one this flashcheck does not know)."""
    from flashcheck.catalogue import get_check

    try:
        return get_check(cid).name
    except UsageError:
        return ""


@dataclass(frozen=True)
class Entry:
    """One finding as a report shows it: the finding, its compare status (None without a baseline), its reproducer."""

    finding: Finding
    status: FindingStatus | None = None
    repro_text: str | None = None

    @property
    def signature(self) -> str:
        return self.finding.signature()


@dataclass(frozen=True)
class Group:
    """Every finding of one check, most severe first."""

    rule: RuleInfo
    entries: tuple[Entry, ...]

    @property
    def worst(self) -> Severity:
        return min((e.finding.severity for e in self.entries), key=_SEVERITY_ORDER.__getitem__)


@dataclass
class ReportView:
    """A run ready to render. `entries` are the current findings; `fixed` the baseline's that are gone."""

    meta: dict[str, Any]
    entries: list[Entry]
    samples: list[Sample]
    fixed: list[Entry] = field(default_factory=list)
    baseline_meta: dict[str, Any] | None = None

    # ---- run metadata -------------------------------------------------------------------------------------------
    @property
    def compared(self) -> bool:
        return self.baseline_meta is not None

    @property
    def findings(self) -> list[Finding]:
        return [e.finding for e in self.entries]

    @property
    def errors(self) -> list[str]:
        return [str(e) for e in self.meta.get("errors", [])]

    @property
    def stats(self) -> dict[str, Any]:
        return dict(self.meta.get("stats", {}))

    @property
    def seed(self) -> str:
        seed = self.meta.get("seed")
        return "-" if seed is None else str(seed)

    @property
    def target(self) -> str:
        return str(self.meta.get("target") or "-")

    @property
    def run_kind(self) -> str:
        return str(self.meta.get("kind") or "run")

    @property
    def duration_s(self) -> float | None:
        """Seconds the run ran: a campaign's summed session time (a resumed campaign does not count the time
        between its sessions), else finished - started."""
        ran = self.meta.get("stats", {}).get("elapsed_s") if self.run_kind == "campaign" else None
        if isinstance(ran, (int, float)):
            return float(ran)
        start, end = self.meta.get("started"), self.meta.get("finished")
        if isinstance(start, (int, float)) and isinstance(end, (int, float)):
            return float(end) - float(start)
        return None

    def environment(self) -> list[tuple[str, str]]:
        """Environment facts, the ones people look for first (device, torch, FlashInfer), then the rest sorted."""
        env = {str(k): str(v) for k, v in dict(self.meta.get("environment", {})).items()}
        env.setdefault("seed", self.seed)
        order = ("seed", *_ENV_ORDER)
        known = [(k, env[k]) for k in order if k in env]
        return known + sorted((k, v) for k, v in env.items() if k not in order)

    # ---- findings -----------------------------------------------------------------------------------------------
    def groups(self) -> list[Group]:
        """Findings grouped by check ID (sorted by ID), each group most severe first, then by place."""
        by_id: dict[str, list[Entry]] = {}
        for e in self.entries:
            by_id.setdefault(e.finding.id, []).append(e)
        return [Group(lookup_rule(es[0].finding), tuple(sorted(es, key=_entry_key))) for _, es in sorted(by_id.items())]

    def rules(self) -> list[RuleInfo]:
        """One rule per check ID among the current and the fixed findings, sorted by ID."""
        seen: dict[str, Finding] = {}
        for e in [*self.entries, *self.fixed]:
            seen.setdefault(e.finding.id, e.finding)
        return [lookup_rule(f) for _, f in sorted(seen.items())]

    def count(self, status: FindingStatus) -> int:
        if status is FindingStatus.FIXED:
            return len(self.fixed)
        return sum(1 for e in self.entries if e.status is status)

    def severity_counts(self) -> dict[str, int]:
        c = Counter(e.finding.severity.value for e in self.entries)
        return {s.value: c.get(s.value, 0) for s in Severity}

    def kind_counts(self) -> dict[str, int]:
        c = Counter(e.finding.kind for e in self.entries)
        return {k: c.get(k, 0) for k in ("static", "runtime", "property")}

    def failing(self) -> bool:
        """Any finding, or with a baseline any *new* finding."""
        if self.compared:
            return self.count(FindingStatus.NEW) > 0
        return bool(self.entries)

    def target_name(self, spec: str) -> str:
        """The name findings carry for the target given as `spec` (``module:Class`` specs differ from it), as the
        run recorded it (``run.json`` ``"target"`` specs and ``"targets"`` names, in the same order)."""
        specs = str(self.meta.get("target") or "").split(",")
        names = self.meta.get("targets")
        if isinstance(names, list) and len(names) == len(specs) and spec in specs:
            name = str(names[specs.index(spec)])
            return name if name == spec else f"{name} ({spec})"
        return spec

    def checks_selected(self) -> list[str]:
        """The check IDs the run selected (``run.json`` ``"checks"``), sorted; empty when the run does not list
        them (a static run). What each did on each target: `check_results`."""
        listed = self.meta.get("checks")
        return sorted({str(c) for c in listed}) if isinstance(listed, list) else []

    def exercise_recorded(self) -> bool:
        """Whether the run recorded what it exercised (``run.json`` ``"checks_by_target"``; runs written before
        flashcheck did are rendered as they were then, each listed check `CheckStatus.UNRECORDED`)."""
        return read_checks_by_target(self.meta) is not None

    def check_results(self) -> list[CheckResult]:
        """Every selected check on every target that ran, by ID then target: failed with a finding there, else
        passed when exercised, not applicable (with why) when it cannot apply there, else not exercised."""
        records = read_checks_by_target(self.meta)
        targets = self.targets_run()
        hit = {(e.finding.id, e.finding.location.target or self.target) for e in self.entries}
        out = []
        for cid in self.checks_selected():
            name = _check_name(cid)
            for t in targets:
                ex = records.get(t, Exercised()) if records is not None else None
                if (cid, t) in hit or (len(targets) == 1 and any(c == cid for c, _ in hit)):
                    status, why = CheckStatus.FAILED, ""
                elif ex is None:
                    status, why = CheckStatus.UNRECORDED, ""
                elif cid in ex.exercised:
                    status, why = CheckStatus.PASSED, ""
                elif cid in ex.not_applicable:
                    status, why = CheckStatus.NOT_APPLICABLE, ex.not_applicable[cid]
                else:
                    status, why = CheckStatus.NOT_EXERCISED, "selected, but nothing in the run reached it"
                out.append(CheckResult(cid, name, t, status, why))
        return out

    def checks_by_status(self, status: CheckStatus) -> list[str]:
        """The checks of `status`, each once: ``FC301``, or ``FC301 on NAME`` where its status differs between
        targets; for a not applicable check its reason follows in parentheses (the wording every text format
        shares)."""
        results = self.check_results()
        out: list[str] = []
        for r in results:
            if r.status is not status:
                continue
            same = all(o.status is status for o in results if o.id == r.id)
            label = r.id if same else f"{r.id} on {r.target}"
            if status is CheckStatus.NOT_APPLICABLE:
                label += f" ({r.reason})"
            if label not in out:
                out.append(label)
        return out

    def checks_text(self) -> list[str]:
        """The checks part of a clean or incomplete verdict, in the words every text format uses: which ran and
        passed, which cannot apply here (and why); not exercised ones are among `incomplete_reasons`."""
        if not self.exercise_recorded():
            listed = self.checks_selected()
            note = "as the run listed them; it did not record whether each was exercised"
            return [f"checks run and passed: {', '.join(listed)} ({note})"] if listed else []
        parts = []
        passed = self.checks_by_status(CheckStatus.PASSED)
        if passed:
            parts.append(f"checks run and passed: {', '.join(passed)}")
        na = self.checks_by_status(CheckStatus.NOT_APPLICABLE)
        if na:
            parts.append(f"not applicable here: {'; '.join(na)}")
        return parts

    def targets_run(self) -> list[str]:
        """The names of the targets the run ran (``run.json`` ``"targets"``, in the order of the ``"target"`` specs),
        less those a campaign dropped as unable to run here; [`target`] when the run does not list them."""
        names = self.meta.get("targets")
        if not isinstance(names, list) or not names:
            return [self.target]
        specs = str(self.meta.get("target") or "").split(",")
        camp = self.meta.get("campaign")
        dropped = set(dict(camp.get("dropped_targets") or {})) if isinstance(camp, dict) else set()
        if len(specs) != len(names):
            return [str(n) for n in names]
        return [str(n) for spec, n in zip(specs, names, strict=True) if spec not in dropped]

    def incomplete_reasons(self) -> list[str]:
        """Why this run cannot be called clean even without findings: recorded errors, a run that never finished
        (killed, interrupted), a stop that was not the budget, targets that could not run, selected checks it never
        exercised (a check that cannot apply to a target is not among them: it is named, with why, not missing)."""
        reasons = [f"run error: {e.splitlines()[0] if e else e}" for e in self.errors]
        if self.meta.get("finished") is None:
            reasons.append("the run never finished (killed or interrupted before it closed)")
        raw = self.meta.get("campaign")
        camp: dict[str, Any] = raw if isinstance(raw, dict) else {}
        stop = str(camp.get("stop_reason") or self.meta.get("stop_reason") or "")
        if stop and not stop.endswith("budget spent"):
            reasons.append(f"stopped early: {stop}")
        for target, why in sorted(dict(camp.get("dropped_targets") or {}).items()):
            reasons.append(f"target {self.target_name(target)} did not run: {why}")
        missed = self.checks_by_status(CheckStatus.NOT_EXERCISED)
        if missed:
            reasons.append(f"selected checks not exercised: {', '.join(missed)} (nothing in the run reached them)")
        return reasons

    def verdict(self) -> str:
        """The one verdict of the run, shown alike by every renderer and the exit code: ``findings``, else
        ``incomplete`` (never green), else ``clean``."""
        if self.failing():
            return "findings"
        return "incomplete" if self.incomplete_reasons() else "clean"

    # ---- statistics for plots -----------------------------------------------------------------------------------
    def first_seen(self) -> dict[str, float]:
        """Check ID -> seconds into the run of the first step that raised it (from the samples)."""
        first: dict[str, float] = {}
        for s in sorted(self.samples, key=lambda s: (s.t, s.step)):
            for fid in s.findings:
                first.setdefault(fid, s.t)
        return dict(sorted(first.items()))

    def occurrences(self) -> dict[str, list[float]]:
        """Check ID -> the times of every step that raised it."""
        occ: dict[str, list[float]] = {}
        for s in self.samples:
            for fid in s.findings:
                occ.setdefault(fid, []).append(s.t)
        return {k: sorted(v) for k, v in sorted(occ.items())}

    def batch_size_histogram(self) -> list[tuple[int, int]]:
        """(batch size, steps) for every batch size the run executed, ascending."""
        return sorted(Counter(s.batch_size for s in self.samples if s.batch_size > 0).items())

    def padded_histogram(self) -> list[tuple[int, int]]:
        """(padded size / graph bucket, steps) ascending."""
        return sorted(Counter(s.padded for s in self.samples if s.padded > 0).items())

    def kv_token_histogram(self) -> list[tuple[str, int]]:
        """Steps per power-of-two bin of total KV tokens, labelled by its upper bound: ('≤64', n), ('≤128', n)..."""
        c: Counter[int] = Counter()
        for s in self.samples:
            if s.total_kv > 0:
                c[max(6, math.ceil(math.log2(s.total_kv)))] += 1
        if not c:
            return []
        out: list[tuple[str, int]] = []
        for b in range(min(c), max(c) + 1):
            label = "≤" + _short(2**b)
            out.append((label, c.get(b, 0)))
        return out

    def workspace_points(self) -> dict[str, list[tuple[Sample, int, int]]]:
        """Workspace name -> (sample, used bytes, allocated bytes) for every step that reported it."""
        pts: dict[str, list[tuple[Sample, int, int]]] = {}
        for s in self.samples:
            for name, (used, alloc) in sorted(s.workspaces.items()):
                pts.setdefault(name, []).append((s, used, alloc))
        return pts


def _short(n: int) -> str:
    """65536 -> '64K', 2097152 -> '2M': compact bin labels."""
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _entry_key(e: Entry) -> tuple[int, str, int, int, str]:
    loc = e.finding.location
    return (
        _SEVERITY_ORDER[e.finding.severity],
        loc.file or loc.target or "",
        loc.line if loc.line is not None else -1,
        loc.step if loc.step is not None else -1,
        e.finding.message,
    )


def _read_repro(run_dir: Path | None, f: Finding) -> str | None:
    """The reproducer's text: the repro file when `f.repro` names one in the run dir, else the snippet itself."""
    if f.repro is None:
        return None
    candidates: list[Path] = []
    if run_dir is not None:
        candidates.append(run_dir / f.repro)
        candidates.append(run_dir / "repros" / f"{f.signature()}.json")
    for p in candidates:
        try:
            if p.is_file():
                text = p.read_text(encoding="utf-8")
                if len(text) > MAX_REPRO_CHARS:
                    return text[:MAX_REPRO_CHARS] + f"\n... (cut at {MAX_REPRO_CHARS} characters; full file: {p})"
                return text
        except (OSError, ValueError):
            continue
    looks_like_path = f.repro.endswith(".json") and "\n" not in f.repro
    return None if looks_like_path else f.repro


def build_view(
    result: RunResult,
    *,
    run_dir: str | Path | None = None,
    baseline: RunResult | None = None,
) -> ReportView:
    """Make the view of `result`; with `baseline`, mark findings new/unchanged and list the baseline's fixed ones.

    `run_dir` (where `result` was loaded from) lets reports embed reproducer files.
    """
    rd = Path(run_dir) if run_dir is not None else None
    base_sigs = {f.signature() for f in baseline.findings} if baseline is not None else set()
    cur_sigs = {f.signature() for f in result.findings}
    entries = []
    for f in result.findings:
        status = None
        if baseline is not None:
            status = FindingStatus.UNCHANGED if f.signature() in base_sigs else FindingStatus.NEW
        entries.append(Entry(f, status, _read_repro(rd, f)))
    entries.sort(key=lambda e: (e.finding.id, *_entry_key(e)))
    fixed: list[Entry] = []
    if baseline is not None:
        fixed = sorted(
            (Entry(f, FindingStatus.FIXED) for f in baseline.findings if f.signature() not in cur_sigs),
            key=lambda e: (e.finding.id, *_entry_key(e)),
        )
    return ReportView(
        meta=dict(result.meta),
        entries=entries,
        samples=sorted(result.samples, key=lambda s: (s.t, s.worker, s.step)),
        fixed=fixed,
        baseline_meta=dict(baseline.meta) if baseline is not None else None,
    )


def evidence_items(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Evidence as (key, compact JSON value) pairs, sorted by key, for tables and lists."""
    out = []
    for k, v in sorted(evidence.items()):
        out.append((str(k), v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)))
    return out


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_seconds(t: float | None) -> str:
    if t is None:
        return "-"
    if t < 120:
        return f"{t:.1f} s"
    if t < 7200:
        return f"{t / 60:.1f} min"
    return f"{t / 3600:.2f} h"
