"""Terminal report: a header with the seed and environment, findings grouped by check, then a one-line verdict.

Colour only when asked (`use_color` decides for a stream: a TTY, and neither ``NO_COLOR`` set nor ``TERM=dumb``);
the plain text is otherwise identical, so logs and goldens read the same as the screen.
"""

from __future__ import annotations

import os
from typing import TextIO

from flashcheck.findings import Severity
from flashcheck.reports.model import Entry, FindingStatus, ReportView, evidence_items, fmt_seconds

__all__ = ["render", "use_color"]

MAX_STACK = 6  # frames shown per finding, innermost last; the JSON/HTML reports keep all of them
MAX_EVIDENCE_CHARS = 100

_RESET = "\x1b[0m"
_STYLES = {
    "bold": "\x1b[1m",
    "dim": "\x1b[2m",
    "red": "\x1b[31m",
    "yellow": "\x1b[33m",
    "blue": "\x1b[34m",
    "green": "\x1b[32m",
    "cyan": "\x1b[36m",
    "magenta": "\x1b[35m",
}
_SEVERITY_STYLE = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "blue"}
_STATUS_STYLE = {FindingStatus.NEW: "magenta", FindingStatus.UNCHANGED: "dim", FindingStatus.FIXED: "green"}


def use_color(stream: TextIO) -> bool:
    """Colour for `stream`: only on a TTY, never with ``NO_COLOR`` (any value, see no-color.org) or ``TERM=dumb``."""
    if os.environ.get("NO_COLOR") is not None or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class _Painter:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        return "".join(_STYLES[s] for s in styles) + text + _RESET


def _header(view: ReportView, p: _Painter) -> list[str]:
    lines = [
        p(f"flashcheck report: {view.run_kind}", "bold")
        + f"  target={view.target}  seed={view.seed}  duration={fmt_seconds(view.duration_s)}"
    ]
    env = [f"{k}={v}" for k, v in view.environment() if k in ("device", "torch", "flashinfer", "cuda", "python")]
    if env:
        lines.append(p("environment: " + "  ".join(env), "dim"))
    facts = dict(view.environment())
    if "detection layers" in facts:
        lines.append(p(f"detection layers: {facts['detection layers']}", "dim"))
    if "layers skipped" in facts:  # what only those layers see was not watched in this run
        lines.append(p(f"layers skipped: {facts['layers skipped']}", "yellow"))
    if view.samples:
        ts = [s.t for s in view.samples]
        lines.append(p(f"steps: {len(view.samples)} sampled, t={min(ts):.1f}..{max(ts):.1f} s", "dim"))
    if view.compared and view.baseline_meta is not None:
        b = view.baseline_meta
        lines.append(
            p(
                f"compared with baseline: {b.get('kind', 'run')} target={b.get('target', '-')} "
                f"seed={b.get('seed', '-')}",
                "dim",
            )
        )
    return lines


def _entry(e: Entry, p: _Painter) -> list[str]:
    f = e.finding
    sev = p(f"{f.severity.value:<7}", _SEVERITY_STYLE[f.severity], "bold")
    status = f" {p('[' + e.status.value + ']', _STATUS_STYLE[e.status])}" if e.status is not None else ""
    conf = "" if f.confidence.value == "high" else p(f" (confidence {f.confidence.value})", "dim")
    lines = [f"  {sev}{status} {p(str(f.location), 'cyan')}{conf}", f"      {f.message}"]
    if f.hint:
        lines.append(f"      {p('hint:', 'green')} {f.hint}")
    ev = evidence_items(f.evidence)
    if ev:
        text = ", ".join(f"{k}={v}" for k, v in ev)
        if len(text) > MAX_EVIDENCE_CHARS:
            text = text[: MAX_EVIDENCE_CHARS - 3] + "..."
        lines.append(p(f"      evidence: {text}", "dim"))
    if f.stack:
        label = "call chain" if f.kind == "static" else "stack (innermost last)"
        lines.append(p(f"      {label}:", "dim"))
        shown = f.stack[-MAX_STACK:]
        if len(f.stack) > len(shown):
            lines.append(p(f"        ... {len(f.stack) - len(shown)} outer frame(s)", "dim"))
        lines.extend(p(f"        {fr}", "dim") for fr in shown)
    if f.repro:
        lines.append(f"      repro: {f.repro}")
    lines.append(p(f"      docs: {f.docs}", "dim"))
    return lines


def _verdict(view: ReportView, p: _Painter) -> str:
    sev = view.severity_counts()
    n = len(view.entries)
    parts = [f"{n} finding(s)"]
    detail = ", ".join(f"{c} {s}" for s, c in sev.items() if c)
    if detail:
        parts[0] += f" ({detail})"
    if view.compared:
        parts.append(
            f"{view.count(FindingStatus.NEW)} new, {view.count(FindingStatus.UNCHANGED)} unchanged, "
            f"{view.count(FindingStatus.FIXED)} fixed"
        )
    if view.errors:
        parts.append(f"{len(view.errors)} run error(s)")
    parts.append(f"seed={view.seed}")
    text = "; ".join(parts)
    if view.failing():
        return p("FAIL: " + text, "red", "bold")
    if view.verdict() == "incomplete":
        return p("INCOMPLETE: " + text + "; " + "; ".join(view.incomplete_reasons()), "red", "bold")
    return p("; ".join(["OK: " + text, *view.checks_text()]), "green", "bold")


def render(view: ReportView, *, color: bool = False) -> str:
    """The terminal report as text (ANSI colour codes only when `color`)."""
    p = _Painter(color)
    lines = _header(view, p)
    for g in view.groups():
        lines.append("")
        n = len(g.entries)
        lines.append(
            p(f"{g.rule.id} {g.rule.name}", "bold", _SEVERITY_STYLE[g.worst])
            + f" ({g.rule.kind}) - {n} finding{'s' if n != 1 else ''}"
        )
        if g.rule.summary and g.rule.summary != g.rule.name:
            lines.append(p(f"  {g.rule.summary}", "dim"))
        for e in g.entries:
            lines.extend(_entry(e, p))
    if view.fixed:
        lines.append("")
        lines.append(p(f"fixed since the baseline ({len(view.fixed)}):", "green", "bold"))
        for e in view.fixed:
            f = e.finding
            lines.append(f"  {p('fixed', 'green')} {f.id} {f.name} {p(str(f.location), 'cyan')}: {f.message}")
    if view.errors:
        lines.append("")
        lines.append(p(f"run errors ({len(view.errors)}):", "red", "bold"))
        lines.extend(f"  {err}" for err in view.errors)
    lines.append("")
    lines.append(_verdict(view, p))
    return "\n".join(lines) + "\n"
