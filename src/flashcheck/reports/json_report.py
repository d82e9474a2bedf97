"""JSON report: the whole view as one versioned document (``"format": "flashcheck-report", "version": 1``).

The document's JSON Schema ships in the package (`schema()`, file ``reports/schema/report-v1.schema.json``); a
consumer should check ``version`` and refuse a newer one. Findings are `Finding.to_dict()` plus a ``status``;
``checks`` lists every selected check on every target that ran with its status (``passed`` only when exercised and
clean, ``not exercised``, ``not applicable`` with its reason, ``failed``, ``unrecorded`` for older runs).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from flashcheck import __version__
from flashcheck.reports.model import Entry, FindingStatus, ReportView

__all__ = ["REPORT_FORMAT", "REPORT_VERSION", "SCHEMA_FILE", "render", "schema", "to_document"]

REPORT_FORMAT = "flashcheck-report"
REPORT_VERSION = 1
SCHEMA_FILE = f"report-v{REPORT_VERSION}.schema.json"


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the document `render` writes."""
    text = resources.files("flashcheck.reports").joinpath("schema").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


def _finding(e: Entry) -> dict[str, Any]:
    d = e.finding.to_dict()
    d["status"] = e.status.value if e.status is not None else None
    return d


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def to_document(view: ReportView) -> dict[str, Any]:
    """The report as a JSON-compatible dict."""
    m = view.meta
    by_check: dict[str, int] = {}
    for e in view.entries:
        by_check[e.finding.id] = by_check.get(e.finding.id, 0) + 1
    compare = None
    if view.compared:
        compare = {s.value: view.count(s) for s in FindingStatus}
    baseline = None
    if view.baseline_meta is not None:
        b = view.baseline_meta
        baseline = {
            "kind": str(b.get("kind") or "run"),
            "target": b.get("target"),
            "seed": b.get("seed"),
            "started": _num(b.get("started")),
        }
    return {
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "tool": {"name": "flashcheck", "version": __version__},
        "run": {
            "kind": view.run_kind,
            "target": m.get("target"),
            "seed": m.get("seed"),
            "command": m.get("command"),
            "started": _num(m.get("started")),
            "finished": _num(m.get("finished")),
            "duration_s": view.duration_s,
            "tool_version": m.get("version"),
            "environment": dict(m.get("environment", {})),
            "stats": view.stats,
            "errors": view.errors,
        },
        "summary": {
            "findings": len(view.entries),
            "failing": view.failing(),
            "verdict": view.verdict(),
            "incomplete": view.incomplete_reasons(),
            "by_severity": view.severity_counts(),
            "by_kind": view.kind_counts(),
            "by_check": dict(sorted(by_check.items())),
            "steps": len(view.samples),
            "compare": compare,
        },
        "baseline": baseline,
        "findings": [_finding(e) for e in view.entries],
        "checks": [
            {"id": r.id, "name": r.name, "target": r.target, "status": r.status.value, "reason": r.reason}
            for r in view.check_results()
        ],
        "fixed": [_finding(e) for e in view.fixed],
        "coverage": {
            "batch_sizes": [{"size": k, "steps": n} for k, n in view.batch_size_histogram()],
            "padded_sizes": [{"size": k, "steps": n} for k, n in view.padded_histogram()],
            "first_seen_s": view.first_seen(),
        },
    }


def render(view: ReportView) -> str:
    """The JSON report text (sorted keys, two-space indent, trailing newline)."""
    return json.dumps(to_document(view), indent=2, sort_keys=True, default=str) + "\n"
