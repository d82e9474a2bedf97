"""The inline stylesheet and script of the HTML report (kept apart from the markup code; no network, no library).

The script only adds conveniences (filter the findings table, expand all, copy a reproducer); the report reads
the same with scripts off.
"""

from __future__ import annotations

__all__ = ["CSS", "JS"]

CSS = """
:root {
  --fg: #1f2937; --muted: #6b7280; --bg: #f6f7f9; --card: #ffffff; --line: #e5e7eb; --accent: #2563eb;
  --error: #dc2626; --warning: #d97706; --info: #2563eb; --new: #7c3aed; --fixed: #059669; --code: #f3f4f6;
}
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
  background: var(--bg); }
header.top { background: #111827; color: #f9fafb; padding: 18px 32px 14px; }
header.top h1 { margin: 0 0 4px; font-size: 20px; font-weight: 650; }
header.top .sub { color: #cbd5e1; font-size: 13px; }
header.top .sub b { color: #f9fafb; font-weight: 600; }
nav.toc { display: flex; gap: 18px; padding: 8px 32px; background: #1f2937; font-size: 13px; flex-wrap: wrap; }
nav.toc a { color: #93c5fd; text-decoration: none; }
main { max-width: 1280px; margin: 0 auto; padding: 20px 32px 48px; }
section { margin-top: 28px; }
h2 { font-size: 17px; margin: 0 0 10px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 0; }
.verdict { font-size: 16px; font-weight: 600; padding: 12px 16px; border-radius: 8px; margin-bottom: 16px; }
.verdict.fail { background: #fef2f2; color: #991b1b; border: 1px solid #fecaca; }
.verdict.ok { background: #ecfdf5; color: #065f46; border: 1px solid #a7f3d0; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr)); gap: 12px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; }
.card .n { font-size: 24px; font-weight: 700; }
.card .l { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card.error .n { color: var(--error); } .card.warning .n { color: var(--warning); }
.card.new .n { color: var(--new); } .card.fixed .n { color: var(--fixed); }
table { border-collapse: collapse; width: 100%; background: var(--card); border: 1px solid var(--line);
  border-radius: 8px; overflow: hidden; }
th, td { text-align: left; padding: 7px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #f9fafb; font-size: 12px; color: var(--muted); text-transform: uppercase; letter-spacing: .03em; }
tr:last-child td { border-bottom: none; }
#findings-table tbody tr:hover { background: #f8fafc; }
#findings-table td.msg { max-width: 560px; }
#findings-table td.check { min-width: 210px; } #findings-table td.check .name { display: block; color: var(--muted);
  font-size: 12.5px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
code { background: var(--code); padding: 1px 4px; border-radius: 4px; }
pre { background: #0f172a; color: #e2e8f0; padding: 10px 12px; border-radius: 6px; overflow-x: auto; margin: 6px 0;
  max-height: 260px; }
a { color: var(--accent); }
.badge { display: inline-block; padding: 1px 7px; border-radius: 999px; font-size: 11.5px; font-weight: 600;
  border: 1px solid transparent; white-space: nowrap; }
.sev-error { background: #fee2e2; color: #991b1b; } .sev-warning { background: #fef3c7; color: #92400e; }
.sev-info { background: #dbeafe; color: #1e40af; }
.st-new { background: #ede9fe; color: #5b21b6; } .st-unchanged { background: #f3f4f6; color: #4b5563; }
.st-fixed { background: #d1fae5; color: #065f46; }
.kind { color: var(--muted); font-size: 12px; }
.toolbar { display: flex; gap: 10px; align-items: center; margin-bottom: 8px; flex-wrap: wrap; }
.toolbar input[type=search] { padding: 5px 9px; border: 1px solid var(--line); border-radius: 6px; min-width: 260px; }
.toolbar label { font-size: 13px; color: var(--muted); }
button { font: inherit; font-size: 12px; padding: 3px 10px; border: 1px solid var(--line); background: var(--card);
  border-radius: 6px; cursor: pointer; }
details.group { background: var(--card); border: 1px solid var(--line); border-radius: 8px; margin-bottom: 12px; }
details.group > summary { padding: 10px 14px; cursor: pointer; display: flex; gap: 10px; align-items: center;
  list-style: none; }
details.group > summary::-webkit-details-marker { display: none; }
details.page { margin: 0 14px 10px; } details.page > summary { cursor: pointer; color: var(--muted); font-size: 13px; }
details.page pre { white-space: pre-wrap; font-size: 12.5px; background: var(--bg); padding: 10px; border-radius: 6px; }
details.group > summary::before { content: "\\25B8"; color: var(--muted); }
details.group[open] > summary::before { content: "\\25BE"; }
details.group > summary .summary { color: var(--muted); font-size: 13px; }
.finding { border-top: 1px solid var(--line); padding: 12px 16px 14px; }
.finding.target { animation: flash 1.2s ease-out; }
@keyframes flash { from { background: #fef9c3; } to { background: transparent; } }
.finding .head { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; }
.finding .where { font-family: ui-monospace, monospace; font-size: 12.5px; color: #0e7490; }
.finding .message { margin: 6px 0 4px; font-weight: 500; }
.finding .hint { color: #065f46; margin: 2px 0 6px; }
.finding .hint::before { content: "hint: "; font-weight: 600; }
.finding .cols { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 16px; margin-top: 6px; }
.finding h4 { margin: 8px 0 4px; font-size: 12px; color: var(--muted); text-transform: uppercase;
  letter-spacing: .04em; }
table.kv td { padding: 3px 8px; font-size: 12.5px; } table.kv td:first-child { color: var(--muted); width: 34%; }
ol.stack { margin: 0; padding-left: 22px; font-family: ui-monospace, monospace; font-size: 12.5px; }
ol.stack li { margin: 2px 0; } ol.stack li.innermost { font-weight: 700; }
ol.stack .fn { color: #7c3aed; } ol.stack .src { color: var(--muted); display: block; white-space: pre; }
.meta { color: var(--muted); font-size: 12px; margin-top: 8px; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 16px; align-items: start; }
figure.wide { grid-column: 1 / -1; }
figure { margin: 0; background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 12px; }
figcaption { font-weight: 600; margin-bottom: 2px; }
figure .caption-note { color: var(--muted); font-size: 12.5px; margin-bottom: 6px; }
svg.plot { width: 100%; height: auto; display: block; }
svg .plot-bg { fill: #fbfcfd; stroke: var(--line); } svg .grid { stroke: #eef0f3; } svg .lane { stroke: #e5e7eb; }
svg .tick { fill: var(--muted); } svg .axis-title { fill: #374151; font-weight: 600; }
svg .count { fill: #374151; font-size: 10px; } svg .row-label { fill: #111827; font-weight: 600; }
svg .first-label { fill: #374151; } svg .note { fill: var(--muted); font-style: italic; }
svg .mark:hover, svg .bar:hover { opacity: .7; }
.legend { display: flex; gap: 14px; flex-wrap: wrap; font-size: 12.5px; margin-top: 6px; }
.legend .sw { display: inline-block; width: 10px; height: 10px; border-radius: 50%; margin-right: 5px;
  vertical-align: middle; } .legend .sw.dash { border-radius: 0; height: 3px; width: 14px; }
.empty { color: var(--muted); font-style: italic; padding: 16px; text-align: center; }
.errors li { font-family: ui-monospace, monospace; font-size: 12.5px; color: #991b1b; margin: 3px 0;
  white-space: pre-wrap; }
footer { color: var(--muted); font-size: 12px; margin-top: 36px; }
@media print { nav.toc, .toolbar, button { display: none; } details.group { break-inside: avoid; } }
"""

JS = """
(function () {
  var q = document.getElementById('filter');
  var table = document.getElementById('findings-table');
  function apply() {
    if (!table) return;
    var text = (q && q.value || '').toLowerCase();
    var sev = {};
    document.querySelectorAll('input[data-sev]').forEach(function (c) { sev[c.dataset.sev] = c.checked; });
    var shown = 0;
    table.querySelectorAll('tbody tr').forEach(function (tr) {
      var ok = (!text || tr.textContent.toLowerCase().indexOf(text) >= 0) && sev[tr.dataset.severity] !== false;
      tr.style.display = ok ? '' : 'none';
      if (ok) shown++;
    });
    var c = document.getElementById('shown-count');
    if (c) c.textContent = shown;
  }
  if (q) q.addEventListener('input', apply);
  document.querySelectorAll('input[data-sev]').forEach(function (c) { c.addEventListener('change', apply); });
  var all = document.getElementById('expand-all');
  if (all) all.addEventListener('click', function () {
    var groups = document.querySelectorAll('details.group');
    var open = Array.prototype.some.call(groups, function (d) { return !d.open; });
    groups.forEach(function (d) { d.open = open; });
    all.textContent = open ? 'collapse all' : 'expand all';
  });
  function reveal() {
    var id = location.hash.slice(1);
    var el = id && document.getElementById(id);
    if (!el) return;
    var d = el.closest('details'); if (d) d.open = true;
    el.classList.remove('target'); void el.offsetWidth; el.classList.add('target');
    el.scrollIntoView({block: 'start'});
  }
  window.addEventListener('hashchange', reveal); reveal();
  document.querySelectorAll('button[data-copy]').forEach(function (b) {
    b.addEventListener('click', function () {
      var src = document.getElementById(b.dataset.copy);
      if (src && navigator.clipboard) navigator.clipboard.writeText(src.textContent).then(function () {
        b.textContent = 'copied'; setTimeout(function () { b.textContent = 'copy'; }, 1200);
      });
    });
  });
})();
"""
