"""SARIF 2.1.0 report, for code scanning (GitHub ``upload-sarif``, GitLab, VS Code's SARIF viewer).

One run; its rules come from the check catalogue (``help`` = the check's page, as `flashcheck rules ID` prints
it). A result's physical location is the finding's file:line, else the innermost frame of its stack (code scanning
drops results without one); scenario steps, regions and targets become logical locations. ``partialFingerprints``
carry `Finding.signature()` and, with a baseline, ``baselineState`` says new / unchanged / absent (fixed). Results are
findings only: a check that found nothing is never a result; what each selected check did per target (passed, not
exercised, not applicable) is in the run's ``properties.checks``, and a check not exercised makes the invocation
unsuccessful with a notification, as every other reason a run is incomplete.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from flashcheck import __version__
from flashcheck.findings import Finding, Frame, Severity
from flashcheck.reports.model import Entry, FindingStatus, ReportView, RuleInfo

__all__ = ["SARIF_SCHEMA_URI", "SARIF_VERSION", "render", "to_document"]

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "SRCROOT"

_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
_BASELINE = {FindingStatus.NEW: "new", FindingStatus.UNCHANGED: "unchanged", FindingStatus.FIXED: "absent"}
_PRECISION = {"high": "high", "medium": "medium", "low": "low"}


class _Paths:
    """Turns finding paths into SARIF artifact locations: relative under the source root, file URIs otherwise."""

    def __init__(self, source_root: str | Path | None) -> None:
        self.root = Path(source_root).resolve() if source_root is not None else None

    def artifact(self, file: str) -> dict[str, Any]:
        p = Path(file)
        if p.is_absolute():
            if self.root is not None:
                try:
                    rel = p.resolve().relative_to(self.root)
                except ValueError:
                    return {"uri": p.as_uri()}
                return {"uri": PurePosixPath(*rel.parts).as_posix(), "uriBaseId": SRCROOT}
            return {"uri": p.as_uri()}
        return {"uri": PurePosixPath(*p.parts).as_posix() if p.parts else file, "uriBaseId": SRCROOT}


def _region(line: int | None, column: int | None = None) -> dict[str, int] | None:
    if line is None or line < 1:
        return None
    r = {"startLine": int(line)}
    if column is not None and column >= 1:
        r["startColumn"] = int(column)
    return r


def _physical(paths: _Paths, file: str, line: int | None, column: int | None = None) -> dict[str, Any]:
    loc: dict[str, Any] = {"artifactLocation": paths.artifact(file)}
    region = _region(line, column)
    if region is not None:
        loc["region"] = region
    return loc


def _logical(f: Finding) -> list[dict[str, Any]]:
    loc = f.location
    parts: list[str] = []
    if loc.target is not None:
        parts.append(f"target:{loc.target}")
    if loc.step is not None:
        parts.append(f"step:{loc.step}" + (f"({loc.step_name})" if loc.step_name else ""))
    if loc.region is not None:
        parts.append(f"region:{loc.region}")
    out: list[dict[str, Any]] = []
    if parts:
        out.append({"name": parts[-1], "fullyQualifiedName": "/".join(parts), "kind": "scenarioStep"})
    if loc.function is not None:
        out.append({"name": loc.function, "kind": "function"})
    return out


def _frame(paths: _Paths, fr: Frame) -> dict[str, Any]:
    loc: dict[str, Any] = {"physicalLocation": _physical(paths, fr.file, fr.line), "message": {"text": fr.function}}
    out: dict[str, Any] = {"location": loc}
    if fr.code and "region" in loc["physicalLocation"]:
        loc["physicalLocation"]["region"]["snippet"] = {"text": fr.code}
    return out


def _location(paths: _Paths, f: Finding) -> dict[str, Any]:
    loc: dict[str, Any] = {}
    if f.location.file is not None:
        loc["physicalLocation"] = _physical(paths, f.location.file, f.location.line, f.location.column)
    elif f.stack:
        top = f.stack[-1]  # innermost frame: where the offending call was made
        loc["physicalLocation"] = _physical(paths, top.file, top.line)
    logical = _logical(f)
    if logical:
        loc["logicalLocations"] = logical
    loc["message"] = {"text": str(f.location)}
    return loc


def _rule(info: RuleInfo, sample: Finding) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "id": info.id,
        "name": info.name,
        "shortDescription": {"text": info.summary or info.name},
        "fullDescription": {"text": info.summary or info.name},
        "defaultConfiguration": {"level": _LEVEL[sample.severity]},
        "properties": {"kind": info.kind, "precision": _PRECISION[sample.confidence.value], "tags": [info.kind]},
    }
    if info.doc:
        rule["help"] = {"text": info.doc, "markdown": info.doc}
    return rule


def _result(paths: _Paths, e: Entry, rule_index: int) -> dict[str, Any]:
    f = e.finding
    text = f.message + (f"\nhint: {f.hint}" if f.hint else "")
    res: dict[str, Any] = {
        "ruleId": f.id,
        "ruleIndex": rule_index,
        "level": _LEVEL[f.severity],
        "message": {"text": text},
        "locations": [_location(paths, f)],
        "partialFingerprints": {"flashcheckSignature/v1": f.signature()},
        "properties": {
            "name": f.name,
            "kind": f.kind,
            "confidence": f.confidence.value,
            "evidence": dict(f.evidence),
            "repro": f.repro,
        },
    }
    if f.stack:
        res["stacks"] = [
            {
                "message": {"text": "call chain" if f.kind == "static" else "stack of the offending event"},
                # SARIF orders frames innermost first; the Finding keeps innermost last
                "frames": [_frame(paths, fr) for fr in reversed(f.stack)],
            }
        ]
    if f.kind == "static" and len(f.stack) > 1:  # a hot path's call chain, root first: code scanning walks it
        res["codeFlows"] = [{"threadFlows": [{"locations": [_frame(paths, fr) for fr in f.stack]}]}]
    if e.status is not None:
        res["baselineState"] = _BASELINE[e.status]
    return res


def to_document(view: ReportView, *, source_root: str | Path | None = None) -> dict[str, Any]:
    """The SARIF log as a dict."""
    paths = _Paths(source_root)
    rules = view.rules()
    index = {r.id: i for i, r in enumerate(rules)}
    samples: dict[str, Finding] = {}
    for e in [*view.entries, *view.fixed]:
        samples.setdefault(e.finding.id, e.finding)
    results = [_result(paths, e, index[e.finding.id]) for e in [*view.entries, *view.fixed]]
    problems = [*view.errors, *view.incomplete_reasons()[len(view.errors) :]]
    invocation: dict[str, Any] = {"executionSuccessful": not problems}
    if problems:
        invocation["toolExecutionNotifications"] = [{"level": "error", "message": {"text": p}} for p in problems]
    env = dict(view.meta.get("environment", {}))
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "flashcheck",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": [_rule(r, samples[r.id]) for r in rules],
            }
        },
        "automationDetails": {"id": f"flashcheck/{view.run_kind}/{view.target}/"},
        "invocations": [invocation],
        "results": results,
        "properties": {
            "seed": view.meta.get("seed"),
            "target": view.meta.get("target"),
            "environment": env,
            "checks": {
                f"{r.id}/{r.target}": r.status.value + (f": {r.reason}" if r.reason else "")
                for r in view.check_results()
            },
        },
    }
    if any(
        "uriBaseId" in loc.get("physicalLocation", {}).get("artifactLocation", {})
        for r in results
        for loc in r["locations"]
    ):
        run["originalUriBaseIds"] = {
            SRCROOT: {"uri": paths.root.as_uri() + "/"}
            if paths.root is not None
            else {"description": {"text": "the repository root the run was started in"}}
        }
    return {"$schema": SARIF_SCHEMA_URI, "version": SARIF_VERSION, "runs": [run]}


def render(view: ReportView, *, source_root: str | Path | None = None) -> str:
    """The SARIF log text."""
    return json.dumps(to_document(view, source_root=source_root), indent=2, sort_keys=True, default=str) + "\n"
