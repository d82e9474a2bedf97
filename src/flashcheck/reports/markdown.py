"""Markdown report for a pull-request comment: a verdict line, a summary table, then findings by check.

Details (evidence, stack, reproducer) fold into ``<details>`` blocks so the comment stays short; past
`MAX_FINDINGS` findings the rest are counted, not listed, to stay under the 65,536 characters GitHub allows.
"""

from __future__ import annotations

from flashcheck.reports.model import Entry, FindingStatus, ReportView, evidence_items, fmt_seconds

__all__ = ["MAX_FINDINGS", "render"]

MAX_FINDINGS = 50
MAX_REPRO_LINES = 40
_SEV_ICON = {"error": "🔴", "warning": "🟠", "info": "🔵"}
_STATUS = {FindingStatus.NEW: "🆕 new", FindingStatus.UNCHANGED: "unchanged", FindingStatus.FIXED: "✅ fixed"}


def _cell(text: str) -> str:
    """Text safe inside a table cell: pipes escaped, newlines folded."""
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """Inline code that survives backticks inside `text`."""
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _details(e: Entry) -> list[str]:
    f = e.finding
    body: list[str] = []
    ev = evidence_items(f.evidence)
    if ev:
        body += ["", "| evidence | value |", "|---|---|"]
        body += [f"| {_cell(k)} | {_cell(_code(v))} |" for k, v in ev]
    if f.stack:
        body += ["", "**Call chain**" if f.kind == "static" else "**Stack** (innermost last)", "", "```text"]
        body += [str(fr) + (f"\n    {fr.code}" if fr.code else "") for fr in f.stack]
        body += ["```"]
    if e.repro_text is not None:
        lines = e.repro_text.rstrip("\n").splitlines()
        cut = len(lines) > MAX_REPRO_LINES
        lang = "json" if e.repro_text.lstrip().startswith("{") else "python"
        body += ["", f"**Reproducer** ({_code(f.repro or '')})", "", f"```{lang}", *lines[:MAX_REPRO_LINES]]
        if cut:
            body.append(f"... ({len(lines) - MAX_REPRO_LINES} more lines in the run directory)")
        body.append("```")
    elif f.repro:
        body += ["", f"**Reproducer**: {_code(f.repro)}"]
    body += ["", f"Signature {_code(f.signature())} · check page: {_code(f.docs)}"]
    return ["<details><summary>details</summary>", *body, "", "</details>"]


def _entry(e: Entry) -> list[str]:
    f = e.finding
    status = f" · **{_STATUS[e.status]}**" if e.status is not None else ""
    conf = f" · confidence {f.confidence.value}" if f.confidence.value != "high" else ""
    lines = [f"- {_SEV_ICON[f.severity.value]} **{f.severity.value}**{status}{conf} at {_code(str(f.location))}", ""]
    lines.append(f"  {f.message}")
    if f.hint:
        lines += ["", f"  *Hint:* {f.hint}"]
    lines.append("")
    lines += ["  " + ln if ln else "" for ln in _details(e)]
    lines.append("")
    return lines


def _verdict(view: ReportView) -> str:
    n = len(view.entries)
    if view.verdict() == "incomplete":
        return "⚠️ **Incomplete run**: " + "; ".join(view.incomplete_reasons())
    if view.compared:
        new = view.count(FindingStatus.NEW)
        head = f"❌ **{new} new finding(s)**" if new else "✅ **No new findings**"
        return (
            f"{head} against the baseline ({view.count(FindingStatus.UNCHANGED)} unchanged, "
            f"{view.count(FindingStatus.FIXED)} fixed)"
        )
    checks = view.checks_text()
    return f"❌ **{n} finding(s)**" if n else "✅ **No findings**" + (f" ({'; '.join(checks)})" if checks else "")


def render(view: ReportView) -> str:
    """The Markdown text."""
    out = [f"## flashcheck {view.run_kind} report", "", _verdict(view), ""]
    env = dict(view.environment())
    out += [
        "| seed | target | device | torch | FlashInfer | steps | duration |",
        "|---|---|---|---|---|---|---|",
        "| "
        + " | ".join(
            _cell(x)
            for x in (
                _code(view.seed),
                view.target,
                env.get("device", "-"),
                env.get("torch", "-"),
                env.get("flashinfer", "-"),
                str(len(view.samples)),
                fmt_seconds(view.duration_s),
            )
        )
        + " |",
        "",
    ]
    if "detection layers" in env:
        out += [f"Detection layers: {_cell(env['detection layers'])}", ""]
    if "layers skipped" in env:  # what only those layers see was not watched in this run
        out += [f"⚠️ Layers skipped: {_cell(env['layers skipped'])}", ""]
    groups = view.groups()
    if groups:
        out += ["| check | kind | findings | first seen |", "|---|---|---|---|"]
        first = view.first_seen()
        for g in groups:
            t = first.get(g.rule.id)
            out.append(
                f"| {g.rule.id} {_cell(g.rule.name)} | {g.rule.kind} | {len(g.entries)} "
                f"| {fmt_seconds(t) if t is not None else '-'} |"
            )
        out.append("")
    shown = 0
    for g in groups:
        out += [f"### {g.rule.id} {g.rule.name}", ""]
        if g.rule.summary and g.rule.summary != g.rule.name:
            out += [f"> {g.rule.summary}", ""]
        for e in g.entries:
            if shown >= MAX_FINDINGS:
                break
            out += _entry(e)
            shown += 1
    if shown < len(view.entries):
        out += [f"*... and {len(view.entries) - shown} more finding(s): see the full report.*", ""]
    if view.fixed:
        out += [f"### Fixed since the baseline ({len(view.fixed)})", ""]
        fixed = (e.finding for e in view.fixed)
        out += [f"- ✅ {f.id} {f.name} at {_code(str(f.location))}: {f.message}" for f in fixed]
        out.append("")
    if view.errors:
        out += [f"### Run errors ({len(view.errors)})", "", "```text", *view.errors, "```", ""]
    out += [
        f"<sub>Reproduce with seed {_code(view.seed)}; `flashcheck report` renders this run in other formats.</sub>",
        "",
    ]
    return "\n".join(out)
