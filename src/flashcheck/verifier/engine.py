"""Runs the static rules over a set of paths and returns findings, after suppressions and the baseline.

Rules are classes declared with `rule(...)`, which makes their docstring the page of their `Check` (``cls.CHECK``);
`flashcheck.verifier.rules.RULES` lists them. Each gets a `Context` with the project index, the hot paths and the
provenance analysis, and calls `Context.report`. A rule that crashes on a project is recorded as an internal error
and the others still run.
"""

from __future__ import annotations

import ast
import gc
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from flashcheck.check import Check
from flashcheck.errors import InvalidArgument
from flashcheck.findings import Confidence, Finding, Frame, Location, Severity
from flashcheck.rundir import RUN_SCHEMA, RunResult
from flashcheck.verifier.baseline import apply_baseline, load_baseline
from flashcheck.verifier.cache import SummaryCache
from flashcheck.verifier.config import StaticConfig
from flashcheck.verifier.frontend import Summary, default_jobs, summarise_files
from flashcheck.verifier.hotpath import HotPaths, Root, find_roots
from flashcheck.verifier.isolated import can_fork, run_isolated, start_isolated
from flashcheck.verifier.project import FunctionInfo, Project
from flashcheck.verifier.provenance import Provenance, ValueFlow, Wrappers
from flashcheck.verifier.source import SourceFile, discover

__all__ = ["Context", "Rule", "StaticResult", "check_paths", "rule", "static_rules"]


class Rule:
    """Base of every static rule: set by `rule(...)`, implement `check`."""

    CHECK: ClassVar[Check]
    id: ClassVar[str] = ""
    name: ClassVar[str] = ""
    severity: ClassVar[Severity] = Severity.ERROR
    confidence: ClassVar[Confidence] = Confidence.HIGH
    # Whether the rule is about serving code only, and so quiet in tests and benchmarks (`SourceFile.is_tooling`)
    serving_only: ClassVar[bool] = True

    def check(self, ctx: Context) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


_RULES: dict[str, type[Rule]] = {}
R = TypeVar("R", bound=type[Rule])


def rule(
    id: str, name: str, *, severity: Severity = Severity.ERROR, confidence: Confidence = Confidence.HIGH
) -> Callable[[R], R]:
    """Class decorator: declare a static rule; its docstring is the page of its `Check` (``cls.CHECK``)."""

    def deco(cls: R) -> R:
        cls.CHECK = Check(id, name, "static", cls.__doc__ or "", severity=severity, confidence=confidence)
        cls.id, cls.name, cls.severity, cls.confidence = id, name, severity, confidence
        _RULES[id] = cls
        return cls

    return deco


def static_rules() -> dict[str, type[Rule]]:
    """Every static rule class by ID (imports the rule modules on first use)."""
    from flashcheck.verifier.rules import RULES

    return dict(sorted({**{r.id: r for r in RULES}, **_RULES}.items()))


def _engine_checks() -> tuple[Check, Check]:
    """FC100 and FC199, which the engine reports itself (suppressions, unparsable files)."""
    from flashcheck.verifier.rules.fc100_bare_suppression import BareSuppression
    from flashcheck.verifier.rules.fc199_file_does_not_parse import FileDoesNotParse

    return BareSuppression.CHECK, FileDoesNotParse.CHECK


@dataclass
class Context:
    """What a rule sees; `report` turns an AST node into a `Finding`."""

    project: Project
    hot: HotPaths
    prov: Provenance
    strict: Provenance  # names alone never make a value DEVICE
    config: StaticConfig
    wrappers: Wrappers
    findings: list[Finding] = field(default_factory=list)

    def report(
        self,
        rule: Rule,
        fn: FunctionInfo,
        node: ast.AST,
        message: str,
        *,
        hint: str,
        evidence: Mapping[str, Any] | None = None,
        chain: Sequence[Frame] = (),
        confidence: Confidence | None = None,
    ) -> None:
        sf = fn.source
        if rule.serving_only and sf.is_tooling:
            return
        line = getattr(node, "lineno", fn.line)
        col = getattr(node, "col_offset", 0) + 1
        site = Frame(sf.relpath, line, fn.short, sf.line_text(line))
        ev: dict[str, Any] = dict(evidence or {})
        if chain:
            names = [f.function for f in chain] + [fn.short]
            ev["chain"] = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
        self.findings.append(
            Finding(
                id=rule.id,
                name=rule.name,
                kind="static",
                message=message,
                severity=rule.severity,
                confidence=confidence or rule.confidence,
                hint=hint,
                location=Location(file=sf.relpath, line=line, column=col, function=fn.qualname),
                evidence=ev,
                stack=(*chain, site) if chain and chain[-1] != site else (site,),
            )
        )


@dataclass
class StaticResult:
    """Outcome of one static run."""

    findings: list[Finding]
    files: list[str]
    lines: int
    roots: int
    suppressed: int = 0
    baselined: int = 0
    internal_errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    all_findings: list[Finding] = field(default_factory=list)  # before the baseline (for --write-baseline)
    rules_run: list[str] = field(default_factory=list)  # IDs of the rules that ran (with FC100/FC199 when selected)
    cached: int = 0  # files whose summary came from the summary cache (not parsed)
    jobs: int = 1  # processes the run could use

    def to_run(self, meta: Mapping[str, Any]) -> RunResult:
        """This result as a run (`flashcheck.rundir.RunResult`), so that every report format renders it: the
        rules that ran are the run's checks, internal errors its errors (an incomplete run, never clean)."""
        from flashcheck.exercised import CHECKS_BY_TARGET, Exercised

        now = time.time()
        doc: dict[str, Any] = {
            "schema": RUN_SCHEMA,
            "tool": "flashcheck",
            "kind": "static",
            "target": "static",
            "targets": ["static"],
            "checks": list(self.rules_run),
            # a rule runs over every file it is given: each rule run is exercised (`flashcheck.exercised`)
            CHECKS_BY_TARGET: {"static": Exercised(set(self.rules_run)).to_dict()},
            "started": now - self.seconds,
            "finished": now,
            "errors": list(self.internal_errors),
            "stats": {
                "files": len(self.files),
                "lines": self.lines,
                "hot_path_roots": self.roots,
                "suppressed": self.suppressed,
                "baselined": self.baselined,
                "cached": self.cached,
                "jobs": self.jobs,
                "seconds": round(self.seconds, 3),
            },
        }
        doc.update(meta)
        return RunResult(meta=doc, findings=list(self.findings), samples=[])


def selected(rule_id: str, rule_name: str, config: StaticConfig) -> bool:
    def hit(sel: str) -> bool:
        return rule_id.startswith(sel.upper()) or sel == rule_name

    return any(hit(s) for s in config.select) and not any(hit(s) for s in config.ignore)


def validate_selectors(config: StaticConfig, rules: Mapping[str, type[Rule]]) -> None:
    known = {i: r.name for i, r in rules.items()}
    for key, sels in (("select", config.select), ("ignore", config.ignore)):
        for s in sels:
            if not any(i.startswith(s.upper()) or s == n for i, n in known.items()):
                raise InvalidArgument(
                    f"{key} entry {s!r} matches no static rule; use an ID (FC101), a prefix (FC1, FC10) or a "
                    f"rule name; known rules: {', '.join(sorted(known))}"
                )


def check_paths(paths: Sequence[str], config: StaticConfig) -> StaticResult:
    """Check every Python file under `paths` with the selected rules."""
    start = time.perf_counter()
    rules = static_rules()
    validate_selectors(config, rules)
    # Every AST stays alive until the rules ran; the cyclic GC would rescan them over and over (3-4x slower).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _check(paths, config, rules, start)
    finally:
        if gc_was_enabled:
            gc.enable()


def _check(paths: Sequence[str], config: StaticConfig, rules: Mapping[str, type[Rule]], start: float) -> StaticResult:
    jobs = config.jobs if config.jobs > 0 else default_jobs()
    if jobs > 1 and can_fork():  # the model lives and dies in a child: this process never frees it
        result = run_isolated(lambda: _analyse(paths, config, rules, start, jobs, release=False))
    else:
        result = _analyse(paths, config, rules, start, jobs, release=True)
    result.seconds = time.perf_counter() - start
    return result


def _analyse(
    paths: Sequence[str],
    config: StaticConfig,
    rules: Mapping[str, type[Rule]],
    start: float,
    jobs: int,
    *,
    release: bool,
) -> StaticResult:
    root = Path(config.root).resolve()
    cache = SummaryCache(config.cache_dir) if config.cache_dir else None
    summaries = summarise_files(discover(paths, config.exclude, root), root, jobs=jobs, cache=cache)
    try:  # new cache entries are written while the rules run
        fork = jobs > 1 and can_fork()
        result = _run_rules(summaries.summaries, config, rules, start, fork=fork, release=release)
    finally:
        summaries.finish()
    result.cached, result.jobs = summaries.loaded, jobs
    return result


def _run_rules(
    summaries: list[Summary],
    config: StaticConfig,
    rules: Mapping[str, type[Rule]],
    start: float,
    *,
    fork: bool,
    release: bool,
) -> StaticResult:
    sources = [sf for sf, _ in summaries]
    project = Project(sources, [mi for _, mi in summaries])
    roots = find_roots(project, config)
    project.calls_by_name()  # shared by every group (it depends on the model alone)
    chosen = [(rid, cls) for rid, cls in rules.items() if selected(rid, cls.name, config)]
    groups = [
        g for g in ([r for r in chosen if r[0] in _OWN_GROUP], [r for r in chosen if r[0] not in _OWN_GROUP]) if g
    ]
    # Each group of rules runs from the model as it was built (no analysis state carried over from another group),
    # so groups may run in forked processes while this one runs the last, and find the same.
    forked = [start_isolated(partial(_run_group, project, roots, config, g)) for g in groups[:-1]] if fork else []
    try:
        outcomes = [_run_group(project, roots, config, g) for g in groups[len(forked) :]]
        outcomes = [pending.result() for pending in forked] + outcomes
    finally:
        for pending in forked:
            pending.cancel()  # only one still at work (this process was interrupted) is stopped
    found = [f for group_findings, _ in outcomes for f in group_findings]
    order = {rid: i for i, (rid, _) in enumerate(chosen)}
    errors = [e for _, e in sorted((err for _, errs in outcomes for err in errs), key=lambda re: order[re[0]])]
    ran = [rid for rid, _ in chosen]
    raw = found + _parse_findings(sources)
    kept, suppressed = _apply_suppressions(raw, sources, set(rules))
    kept = [f for f in kept if selected(f.id, f.name, config)]
    kept.sort(key=lambda f: (f.location.file or "", f.location.line or 0, f.location.column or 0, f.id))
    if release:  # findings are plain data: the model and its trees can go (a child leaves without freeing them)
        project.release()
    new, baselined = kept, 0
    if config.baseline and Path(config.baseline).exists():
        new, baselined = apply_baseline(kept, load_baseline(config.baseline))
    return StaticResult(
        findings=new,
        files=[s.relpath for s in sources],
        lines=sum(len(s.lines) for s in sources),
        roots=len(roots),
        suppressed=suppressed,
        baselined=baselined,
        internal_errors=errors,
        seconds=time.perf_counter() - start,
        all_findings=kept,
        rules_run=sorted(ran),
    )


# FC101 alone takes about as long as the other rules together: it runs in a group of its own.
_OWN_GROUP = frozenset({"FC101"})


def _run_group(
    project: Project, roots: list[Root], config: StaticConfig, group: Sequence[tuple[str, type[Rule]]]
) -> tuple[list[Finding], list[tuple[str, str]]]:
    """Run `group`'s rules in order with an analysis state fresh from the model; their findings and internal
    errors (with the rule's ID)."""
    project.forget_answers()
    hot = HotPaths(project, roots)
    flow = ValueFlow(project)
    ctx = Context(
        project,
        hot,
        Provenance(project, config.host_names, flow=flow),
        Provenance(project, config.host_names, names_give_device=False, flow=flow),
        config,
        Wrappers(flow),
    )
    errors: list[tuple[str, str]] = []
    for rid, cls in group:
        try:
            cls().check(ctx)
        except Exception:  # a broken rule must not hide the others' findings; the run exits 2
            tb = traceback.format_exc().splitlines()
            errors.append((rid, f"rule {rid} ({cls.name}) crashed:\n" + "\n".join(tb[-12:])))
    return ctx.findings, errors


def _parse_findings(sources: Iterable[SourceFile]) -> list[Finding]:
    parse = _engine_checks()[1]
    out = []
    for s in sources:
        if s.error is None:
            continue
        out.append(
            parse.finding(
                f"{s.relpath} {s.error}; it was not checked",
                hint="fix the syntax error (or exclude the file) so the other rules can check it",
                location=Location(file=s.relpath, line=s.error_line, column=s.error_column, function=s.module),
                stack=(Frame(s.relpath, s.error_line, "<module>", s.line_text(s.error_line)),),
            )
        )
    return out


def _apply_suppressions(
    findings: list[Finding], sources: Iterable[SourceFile], known: set[str]
) -> tuple[list[Finding], int]:
    """Drop findings covered by a ``# flashcheck: ignore[ID] reason``; report suppressions that lack a reason."""
    by_file = {s.relpath: s for s in sources if s.suppressions}
    kept: list[Finding] = []
    suppressed = 0
    for f in findings:
        sf = by_file.get(f.location.file or "")
        if (
            sf is not None
            and f.location.line is not None
            and any(f.location.line in s.covers and any(f.id.startswith(i) for i in s.ids) for s in sf.suppressions)
        ):
            suppressed += 1
            continue
        kept.append(f)
    bare = _engine_checks()[0]
    for sf in by_file.values():
        for s in sf.suppressions:
            problem = _suppression_problem(s.ids, s.reason, known)
            if problem:
                kept.append(
                    bare.finding(
                        f"suppression comment {problem}",
                        hint="write `# flashcheck: ignore[FC101] why this is safe here` "
                        "(IDs and a reason are required)",
                        location=Location(file=sf.relpath, line=s.line, column=1, function=sf.module),
                        stack=(Frame(sf.relpath, s.line, "<module>", sf.line_text(s.line)),),
                    )
                )
    return kept, suppressed


def _suppression_problem(ids: tuple[str, ...], reason: str, known: set[str]) -> str:
    if not ids:
        return "names no rule ID"
    unknown = [i for i in ids if not any(k.startswith(i) for k in known)]
    if unknown:
        return f"names unknown rule ID(s) {', '.join(unknown)}"
    if not reason:
        return f"for {', '.join(ids)} gives no reason"
    return ""
