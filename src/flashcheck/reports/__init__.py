"""Reports: renderers over one run result (terminal, JSON, JUnit XML, SARIF 2.1.0, Markdown, self-contained HTML).

``render(result, "sarif")`` returns the text of one format; every renderer draws from the same `ReportView`
(`model.build_view`), so grouping, ordering and the new/fixed/unchanged status of ``--compare`` agree across formats.
Renderer modules are imported only when used.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Literal, get_args

from flashcheck.errors import InvalidArgument
from flashcheck.reports.model import FindingStatus, ReportView, build_view
from flashcheck.rundir import RunResult

__all__ = [
    "FORMATS",
    "FORMAT_ALIASES",
    "SUFFIXES",
    "FindingStatus",
    "Format",
    "ReportView",
    "build_view",
    "render",
    "render_view",
]

Format = Literal["terminal", "concise", "json", "junit", "sarif", "markdown", "html"]
FORMATS: tuple[Format, ...] = get_args(Format)
FORMAT_ALIASES: dict[str, str] = {"md": "markdown", "text": "terminal", "txt": "terminal"}

# format -> renderer module (each exposes ``render(view, **options) -> str``)
_MODULES: dict[Format, str] = {
    "terminal": "flashcheck.reports.terminal",
    "concise": "flashcheck.reports.concise",
    "json": "flashcheck.reports.json_report",
    "junit": "flashcheck.reports.junit",
    "sarif": "flashcheck.reports.sarif",
    "markdown": "flashcheck.reports.markdown",
    "html": "flashcheck.reports.html",
}

# the file suffix a format is usually written with (the CLI's --out is free-form)
SUFFIXES: dict[Format, str] = {
    "concise": ".txt",
    "terminal": ".txt",
    "json": ".json",
    "junit": ".xml",
    "sarif": ".sarif",
    "markdown": ".md",
    "html": ".html",
}


def check_format(fmt: str) -> Format:
    """`fmt` as a `Format` (``md`` and ``text`` are aliases of markdown and terminal), or an `InvalidArgument` that
    lists the known ones."""
    fmt = FORMAT_ALIASES.get(fmt, fmt)
    if fmt not in FORMATS:
        raise InvalidArgument(f"unknown report format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return fmt


def render_view(view: ReportView, fmt: str, *, color: bool = False, source_root: str | Path | None = None) -> str:
    """Render a prepared view. `color` applies to the terminal format only; `source_root` to SARIF only (absolute
    paths under it become relative, as code scanning expects)."""
    f = check_format(fmt)
    mod = importlib.import_module(_MODULES[f])
    if f == "terminal":
        return str(mod.render(view, color=color))
    if f == "sarif":
        return str(mod.render(view, source_root=source_root))
    return str(mod.render(view))


def render(
    result: RunResult,
    fmt: str,
    *,
    baseline: RunResult | None = None,
    run_dir: str | Path | None = None,
    color: bool = False,
    source_root: str | Path | None = None,
) -> str:
    """Render `result` in format `fmt`; with `baseline`, findings are marked new / fixed / unchanged."""
    view = build_view(result, run_dir=run_dir, baseline=baseline)
    return render_view(view, fmt, color=color, source_root=source_root)
