"""Concise report: one ``file:line:col: ID name [severity, confidence] message`` line per finding (editors and CI
logs jump to it), with the call chain and hint indented under it, then a count per check and the verdict. The
default of `flashcheck static`; any run renders this way with ``--format concise``."""

from __future__ import annotations

from collections import Counter

from flashcheck.reports.model import ReportView

__all__ = ["render"]


def render(view: ReportView) -> str:
    out: list[str] = []
    for e in view.entries:
        f = e.finding
        loc = f.location
        where = f"{loc.file}:{loc.line}:{loc.column or 1}" if loc.file else str(loc)
        status = f" [{e.status.value}]" if e.status is not None else ""
        out.append(
            f"{where}: {f.id} {f.name} [{f.severity.value}, {f.confidence.value} confidence]{status} {f.message}"
        )
        chain = f.evidence.get("chain")
        if isinstance(chain, list) and chain:
            out.append(f"    chain: {' -> '.join(str(c) for c in chain)}")
        if f.hint:
            out.append(f"    hint: {f.hint}")
    if view.entries:
        counts = Counter(e.finding.id for e in view.entries)
        out += ["", "by check: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))]
    verdict = view.verdict()
    if verdict == "incomplete":
        out.append("INCOMPLETE: " + "; ".join(view.incomplete_reasons()))
    elif verdict == "findings":
        out.append(f"FAIL: {len(view.entries)} finding(s)")
    else:
        out.append("; ".join(["OK: no findings", *view.checks_text()]))
    return "\n".join(out) + "\n"
