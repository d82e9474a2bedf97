"""Self-contained HTML report: one file with inline CSS, JS and SVG that opens from disk with no network.

It shows the verdict and counts, a findings table, the findings grouped by property with reproducer and stack or
call chain, plots (workspace bytes used vs allocated across fuzzed shapes, time to first finding per property,
batch shapes covered), the environment and the run's errors. Element ids (``findings-table``, ``plot-workspace``,
``plot-first-finding``, ``plot-batch-sizes``, ``plot-kv-tokens``) are stable for tests and links.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from html import escape

from flashcheck import __version__
from flashcheck.reports import svg
from flashcheck.reports.html_assets import CSS, JS
from flashcheck.reports.model import (
    Entry,
    FindingStatus,
    Group,
    ReportView,
    evidence_items,
    fmt_bytes,
    fmt_seconds,
)

__all__ = ["PLOT_IDS", "render"]

PLOT_IDS = ("plot-workspace", "plot-first-finding", "plot-batch-sizes", "plot-kv-tokens")
MAX_SCATTER_POINTS = 4000  # per workspace; a night-long run keeps every n-th sample so the file stays small
_SEV = ("error", "warning", "info")


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _anchor(e: Entry) -> str:
    prefix = "fixed-" if e.status is FindingStatus.FIXED else "f-"
    return prefix + e.signature


def _badge_sev(sev: str) -> str:
    return f'<span class="badge sev-{_e(sev)}">{_e(sev)}</span>'


def _badge_status(e: Entry) -> str:
    if e.status is None:
        return ""
    return f'<span class="badge st-{e.status.value}">{e.status.value}</span>'


def _time(ts: object) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    return datetime.fromtimestamp(float(ts), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# ---- header and summary ---------------------------------------------------------------------------------------------
def _header(view: ReportView) -> str:
    env = dict(view.environment())
    facts = [
        ("target", view.target),
        ("seed", view.seed),
        ("device", env.get("device", "-")),
        ("started", _time(view.meta.get("started"))),
        ("duration", fmt_seconds(view.duration_s)),
    ]
    sub = " &nbsp;·&nbsp; ".join(f"{_e(k)} <b>{_e(v)}</b>" for k, v in facts)
    return (
        f'<header class="top"><h1>flashcheck {_e(view.run_kind)} report</h1><div class="sub">{sub}</div></header>\n'
        '<nav class="toc"><a href="#summary">Summary</a><a href="#findings">Findings</a>'
        + ('<a href="#errors">Run errors</a>' if view.errors else "")
        + '<a href="#plots">Plots</a><a href="#by-property">By property</a><a href="#environment">Environment</a>'
        + ('<a href="#checks">Checks</a>' if view.check_results() else "")
        + ('<a href="#fixed">Fixed</a>' if view.fixed else "")
        + "</nav>"
    )


def _summary(view: ReportView) -> str:
    n = len(view.entries)
    if view.compared:
        new = view.count(FindingStatus.NEW)
        text = f"{new} new finding(s) against the baseline" if new else "No new findings against the baseline"
    else:
        text = f"{n} finding(s)" if n else "No findings"
    if view.verdict() == "incomplete":
        text = "Incomplete run: " + "; ".join(view.incomplete_reasons())
    elif view.verdict() == "clean":
        text = "; ".join([text, *view.checks_text()])
    cls = "ok" if view.verdict() == "clean" else "fail"
    sev = view.severity_counts()
    cards = [(str(n), "findings", "")]
    cards += [(str(sev[s]), s, s) for s in _SEV]
    if view.compared:
        cards += [
            (str(view.count(FindingStatus.NEW)), "new", "new"),
            (str(view.count(FindingStatus.UNCHANGED)), "unchanged", ""),
            (str(view.count(FindingStatus.FIXED)), "fixed", "fixed"),
        ]
    cards += [
        (str(len(view.groups())), "properties hit", ""),
        (str(len(view.samples)), "steps sampled", ""),
        (str(len(view.errors)), "run errors", "error" if view.errors else ""),
    ]
    cards_html = "".join(
        f'<div class="card {c}"><div class="n">{_e(v)}</div><div class="l">{_e(label)}</div></div>'
        for v, label, c in cards
    )
    return (
        f'<section id="summary"><div class="verdict {cls}">{"✗" if cls == "fail" else "✓"} {_e(text)}'
        f' <span class="kind">seed {_e(view.seed)}</span></div><div class="cards">{cards_html}</div></section>'
    )


# ---- findings -------------------------------------------------------------------------------------------------------
def _findings_table(view: ReportView) -> str:
    head = (
        '<section id="findings"><h2>Findings</h2>'
        '<div class="toolbar"><input type="search" id="filter" placeholder="filter: check, file, message..." '
        'aria-label="filter findings">'
        + "".join(f'<label><input type="checkbox" data-sev="{s}" checked> {s}</label>' for s in _SEV)
        + f'<span class="kind"><span id="shown-count">{len(view.entries)}</span> shown</span></div>'
    )
    if not view.entries:
        return (
            head + '<table id="findings-table"><tbody><tr><td class="empty">No findings.</td></tr></tbody>'
            "</table></section>"
        )
    status_th = "<th>status</th>" if view.compared else ""
    rows = []
    for e in view.entries:
        f = e.finding
        status_td = f"<td>{_badge_status(e)}</td>" if view.compared else ""
        rows.append(
            f'<tr data-severity="{f.severity.value}" data-check="{_e(f.id)}">{status_td}'
            f"<td>{_badge_sev(f.severity.value)}</td>"
            f'<td class="check"><a href="#{_anchor(e)}"><b>{_e(f.id)}</b></a> '
            f'<span class="name">{_e(f.name)}</span></td>'
            f'<td class="kind">{_e(f.kind)}</td><td><code>{_e(f.location)}</code></td>'
            f'<td class="msg">{_e(f.message)}</td></tr>'
        )
    return (
        head + f'<table id="findings-table"><thead><tr>{status_th}<th>severity</th><th>check</th><th>kind</th>'
        "<th>where</th><th>message</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>"
    )


def _stack(e: Entry) -> str:
    f = e.finding
    if not f.stack:
        return ""
    title = "Call chain (outermost first)" if f.kind == "static" else "Stack (innermost last)"
    items = []
    for i, fr in enumerate(f.stack):
        cls = ' class="innermost"' if i == len(f.stack) - 1 else ""
        code = f'<span class="src">    {_e(fr.code)}</span>' if fr.code else ""
        items.append(f'<li{cls}>{_e(fr.file)}:{fr.line} in <span class="fn">{_e(fr.function)}</span>{code}</li>')
    return f'<h4>{title}</h4><ol class="stack">{"".join(items)}</ol>'


def _repro(e: Entry) -> str:
    f = e.finding
    if f.repro is None and e.repro_text is None:
        kind = "static findings point at source, not at an input" if f.kind == "static" else "none recorded"
        return f'<h4>Reproducer</h4><div class="kind">{_e(kind)}</div>'
    pid = f"repro-{_anchor(e)}"
    out = '<h4>Reproducer <button type="button" data-copy="' + pid + '">copy</button></h4>'
    if f.repro and e.repro_text != f.repro:
        out += f'<div class="kind">file <code>{_e(f.repro)}</code> in the run directory</div>'
    body = e.repro_text if e.repro_text is not None else f.repro or ""
    return out + f'<pre id="{pid}">{_e(body)}</pre>'


def _finding_block(e: Entry) -> str:
    f = e.finding
    ev = evidence_items(f.evidence)
    ev_html = (
        '<h4>Evidence</h4><table class="kv">'
        + "".join(f"<tr><td>{_e(k)}</td><td><code>{_e(v)}</code></td></tr>" for k, v in ev)
        + "</table>"
        if ev
        else ""
    )
    conf = "" if f.confidence.value == "high" else f'<span class="kind">confidence {_e(f.confidence.value)}</span>'
    hint = f'<div class="hint">{_e(f.hint)}</div>' if f.hint else ""
    return (
        f'<div class="finding" id="{_anchor(e)}" data-severity="{f.severity.value}">'
        f'<div class="head">{_badge_sev(f.severity.value)}{_badge_status(e)}'
        f'<span class="where">{_e(f.location)}</span>{conf}</div>'
        f'<div class="message">{_e(f.message)}</div>{hint}'
        f'<div class="cols"><div>{ev_html}{_stack(e)}</div><div>{_repro(e)}</div></div>'
        f'<div class="meta">signature <code>{_e(e.signature)}</code> · {_e(f.kind)} · '
        f'<a href="#page-{_e(f.id)}">{_e(f.id)} check page</a> (<code>{_e(f.docs)}</code>)</div></div>'
    )


def _group(g: Group, first: float | None) -> str:
    n = len(g.entries)
    when = f" · first after {fmt_seconds(first)}" if first is not None else ""
    return (
        f'<details class="group" id="group-{_e(g.rule.id)}" open><summary>{_badge_sev(g.worst.value)}'
        f"<h3>{_e(g.rule.id)} {_e(g.rule.name)}</h3>"
        f'<span class="kind">{_e(g.rule.kind)} · {n} finding{"s" if n != 1 else ""}{_e(when)}</span>'
        f'<span class="summary">{_e(g.rule.summary if g.rule.summary != g.rule.name else "")}</span></summary>'
        + (
            f'<details class="page" id="page-{_e(g.rule.id)}"><summary>{_e(g.rule.id)} check page</summary>'
            f"<pre>{_e(g.rule.doc)}</pre></details>"
            if g.rule.doc
            else ""
        )
        + "".join(_finding_block(e) for e in g.entries)
        + "</details>"
    )


def _by_property(view: ReportView) -> str:
    groups = view.groups()
    first = view.first_seen()
    body = "".join(_group(g, first.get(g.rule.id)) for g in groups) or '<div class="empty">Nothing to show.</div>'
    tools = '<div class="toolbar"><button type="button" id="expand-all">collapse all</button></div>' if groups else ""
    return f'<section id="by-property"><h2>Findings by property</h2>{tools}{body}</section>'


# ---- plots ----------------------------------------------------------------------------------------------------------
def _figure(title: str, note: str, body: str, legend: str = "", *, wide: bool = False) -> str:
    cls = ' class="wide"' if wide else ""
    return (
        f'<figure{cls}><figcaption>{_e(title)}</figcaption><div class="caption-note">{_e(note)}</div>{body}{legend}'
        "</figure>"
    )


def _empty_plot(plot_id: str, text: str) -> str:
    return f'<div class="plot empty" id="{plot_id}">{_e(text)}</div>'


def _workspace_plot(view: ReportView) -> str:
    pts = view.workspace_points()
    title = "Workspace bytes: used vs allocated, per fuzzed shape"
    if not pts:
        return _figure(title, "", _empty_plot("plot-workspace", "No step reported workspace usage."))
    series: list[svg.Series] = []
    legend = []
    over = zero = 0
    peak: list[str] = []
    for i, (name, items) in enumerate(pts.items()):
        color = svg.PALETTE[i % len(svg.PALETTE)]
        stride = max(1, len(items) // MAX_SCATTER_POINTS)
        kept = items[::stride]
        used, alloc = [], []
        for s, u, a in kept:
            shape = f"bs={s.batch_size} (padded {s.padded}), qo={s.total_qo}, kv={s.total_kv} tokens"
            tip = f"{name} step {s.step} ({s.op}): used {fmt_bytes(u)} of {fmt_bytes(a)}; {shape}"
            x = float(max(1, s.total_qo + s.total_kv))
            if u <= 0:  # nothing used: no point on a byte axis (a log axis has no 0), counted in the legend
                zero += 1
            else:
                used.append(svg.Point(x, float(u), tip, bad=u > a))
            alloc.append(svg.Point(x, float(max(1, a)), f"{name} allocated {fmt_bytes(a)} at step {s.step}"))
        over += sum(1 for _, u, a in items if u > a)
        series.append(svg.Series(f"{name} allocated", tuple(alloc), color, mark="dash"))
        series.append(svg.Series(f"{name} used", tuple(used), color))
        top = max(items, key=lambda it: it[1] / max(1, it[2]))
        peak.append(f"{name}: peak {fmt_bytes(top[1])} of {fmt_bytes(top[2])} ({100 * top[1] / max(1, top[2]):.0f}%)")
        legend.append(
            f'<span><span class="sw" style="background:{color}"></span>{_e(name)} used</span>'
            f'<span><span class="sw dash" style="background:{color}"></span>{_e(name)} allocated</span>'
        )
    if over:
        legend.append(f'<span><span class="sw" style="background:{svg.BAD}"></span>used &gt; allocated ({over})</span>')
    if zero:
        legend.append(f"<span>{zero} step(s) used 0 bytes (not plotted)</span>")
    body = svg.scatter(
        "plot-workspace",
        title,
        series,
        x_fmt=lambda v: f"{v:g}",
        y_fmt=fmt_bytes,
        x_title="tokens in the batch (qo + kv)",
        y_title="bytes",
        size=(1000, 340),
    )
    return _figure(title, "; ".join(peak), body, f'<div class="legend">{"".join(legend)}</div>', wide=True)


def _first_finding_plot(view: ReportView) -> str:
    title = "Findings over time: time to first finding per property"
    groups = view.groups()
    if not groups:
        return _figure(title, "", _empty_plot("plot-first-finding", "No findings."))
    first, occ = view.first_seen(), view.occurrences()
    t_max = max([s.t for s in view.samples] + [view.duration_s or 0.0, 1.0])
    rows = []
    for g in groups:
        color = {"error": "#dc2626", "warning": "#d97706", "info": "#2563eb"}[g.worst.value]
        label = f"{g.rule.id} {g.rule.name}"
        label = label if len(label) <= 34 else label[:33] + "…"
        rows.append((g.rule.id, label, color, first.get(g.rule.id), occ.get(g.rule.id, [])))
    note = "◆ first step that raised the property; ticks: later steps that raised it again"
    body = svg.timeline("plot-first-finding", title, rows, t_max, t_fmt=fmt_seconds, width=1000)
    return _figure(title, note, body, wide=True)


def _batch_plots(view: ReportView) -> str:
    hist = view.batch_size_histogram()
    title = "Batch sizes covered"
    if hist:
        cats = _bin_sizes(hist)
        padded = view.padded_histogram()
        note = f"{len(hist)} distinct batch sizes over {len(view.samples)} steps"
        if padded:
            note += "; graph buckets: " + ", ".join(f"{k} ({n})" for k, n in padded[:12])
        body = svg.bars(
            "plot-batch-sizes",
            title,
            cats,
            x_title="batch size (real requests)",
            y_title="steps",
            tip=lambda c, n: f"batch size {c}: {n} steps",
        )
        a = _figure(title, note, body)
    else:
        a = _figure(title, "", _empty_plot("plot-batch-sizes", "No steps recorded."))
    kv = view.kv_token_histogram()
    title2 = "KV tokens per batch"
    if kv:
        body2 = svg.bars(
            "plot-kv-tokens",
            title2,
            kv,
            x_title="total KV tokens in the batch (power-of-two bins)",
            y_title="steps",
            color=svg.PALETTE[2],
            tip=lambda c, n: f"{c} KV tokens: {n} steps",
        )
        b = _figure(title2, "how long the fuzzed sequences were, summed over the batch", body2)
    else:
        b = _figure(title2, "", _empty_plot("plot-kv-tokens", "No steps recorded."))
    return a + b


def _bin_sizes(hist: list[tuple[int, int]]) -> list[tuple[str, int]]:
    """Every size as its own bar up to 48 distinct sizes, else power-of-two bins."""
    if len(hist) <= 48:
        lo, hi = hist[0][0], hist[-1][0]
        d = dict(hist)
        if hi - lo < 64:  # show the gaps: sizes the fuzzer never tried are as telling as the ones it did
            return [(str(k), d.get(k, 0)) for k in range(lo, hi + 1)]
        return [(str(k), n) for k, n in hist]
    bins: dict[int, int] = {}
    for k, n in hist:
        b = max(0, (k - 1).bit_length())
        bins[b] = bins.get(b, 0) + n
    return [(f"{2 ** (b - 1) + 1}-{2**b}" if b else "1", bins.get(b, 0)) for b in range(min(bins), max(bins) + 1)]


def _plots(view: ReportView) -> str:
    return (
        '<section id="plots"><h2>Plots</h2><div class="plots">'
        + _first_finding_plot(view)
        + _workspace_plot(view)
        + _batch_plots(view)
        + "</div></section>"
    )


# ---- environment, stats, errors, fixed ------------------------------------------------------------------------------
def _environment(view: ReportView) -> str:
    rows = [(k, v) for k, v in view.environment()]
    rows += [
        (
            "command",
            " ".join(view.meta["command"])
            if isinstance(view.meta.get("command"), list)
            else str(view.meta.get("command") or "-"),
        )
    ]
    rows += [("started", _time(view.meta.get("started"))), ("finished", _time(view.meta.get("finished")))]
    env = "".join(f"<tr><td>{_e(k)}</td><td><code>{_e(v)}</code></td></tr>" for k, v in rows)
    stats = "".join(
        f"<tr><td>{_e(k)}</td><td><code>{_e(v if isinstance(v, str) else json.dumps(v, sort_keys=True))}</code></td>"
        "</tr>"
        for k, v in sorted(view.stats.items())
    )
    stats_html = f'<table class="kv" id="stats-table">{stats}</table>' if stats else '<div class="empty">none</div>'
    return (
        '<section id="environment"><h2>Environment and run</h2><div class="plots">'
        f'<figure><figcaption>Environment</figcaption><table class="kv" id="environment-table">{env}</table></figure>'
        f"<figure><figcaption>Statistics</figcaption>{stats_html}</figure></div></section>"
    )


def _checks(view: ReportView) -> str:
    """Every selected check on every target that ran, with what it did there (`ReportView.check_results`)."""
    results = view.check_results()
    if not results:
        return ""
    rows = "".join(
        f'<tr><td><b>{_e(r.id)}</b> {_e(r.name)}</td><td>{_e(r.target)}</td><td><span class="badge">'
        f"{_e(r.status.value)}</span></td><td>{_e(r.reason)}</td></tr>"
        for r in results
    )
    return (
        '<section id="checks"><h2>Checks</h2><table id="checks-table"><thead><tr><th>check</th><th>target</th>'
        f"<th>status</th><th>why</th></tr></thead><tbody>{rows}</tbody></table></section>"
    )


def _fixed(view: ReportView) -> str:
    if not view.fixed:
        return ""
    rows = "".join(
        f'<tr id="{_anchor(e)}"><td><span class="badge st-fixed">fixed</span></td>'
        f"<td><b>{_e(e.finding.id)}</b> {_e(e.finding.name)}</td><td><code>{_e(e.finding.location)}</code></td>"
        f"<td>{_e(e.finding.message)}</td></tr>"
        for e in view.fixed
    )
    return (
        f'<section id="fixed"><h2>Fixed since the baseline ({len(view.fixed)})</h2><table id="fixed-table"><thead>'
        f"<tr><th>status</th><th>check</th><th>where</th><th>message</th></tr></thead><tbody>{rows}</tbody></table>"
        "</section>"
    )


def _errors(view: ReportView) -> str:
    if not view.errors:
        return ""
    items = "".join(f"<li>{_e(err)}</li>" for err in view.errors)
    return f'<section id="errors"><h2>Run errors ({len(view.errors)})</h2><ul class="errors">{items}</ul></section>'


def render(view: ReportView) -> str:
    """The whole HTML document."""
    title = f"flashcheck {view.run_kind} report: {view.target} (seed {view.seed})"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="flashcheck {_e(__version__)}">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>\n<body>\n"
        + _header(view)
        + "\n<main>\n"
        + _summary(view)
        + "\n"
        + _findings_table(view)
        + _errors(view)
        + "\n"
        + _plots(view)
        + "\n"
        + _by_property(view)
        + "\n"
        + _environment(view)
        + _checks(view)
        + _fixed(view)
        + f"\n<footer>flashcheck {_e(__version__)} · every finding links to its check page; this file needs no "
        "network and opens from disk.</footer>\n</main>\n"
        f"<script>{JS}</script>\n</body></html>\n"
    )
