"""``flashcheck report RUN_DIR [--format F] [--out FILE] [--compare BASELINE_RUN_DIR]``: render a run directory.

Exit codes: 0 when the run is clean (with ``--compare``: no *new* findings), 1 with findings, 2 for bad input, 4 when
the run did not complete (never clean).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flashcheck._files import check_output_path
from flashcheck.cli import EXIT_CLEAN, EXIT_FINDINGS, EXIT_INCOMPLETE
from flashcheck.cli._common import add_out
from flashcheck.errors import InvalidArgument
from flashcheck.findings import atomic_write_text
from flashcheck.reports import FORMATS, build_view, check_format, render_view
from flashcheck.reports.terminal import use_color
from flashcheck.rundir import RunResult, load_run


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory written by the fuzzer, a campaign or a static run"
    )
    p.add_argument(
        "--format",
        "-f",
        default="terminal",
        metavar="FORMAT",
        help=f"one of {', '.join(FORMATS)} (default terminal)",
    )
    add_out(p, "write the report to FILE (atomically) instead of stdout", metavar="FILE")
    p.add_argument(
        "--compare",
        metavar="BASELINE_RUN_DIR",
        help="mark findings new / fixed / unchanged against this run (matched by finding signature); "
        "the exit code then fails only on new findings",
    )
    p.add_argument(
        "--source-root",
        metavar="DIR",
        help="SARIF: absolute paths under DIR become relative to it (default: the current directory)",
    )
    color = p.add_mutually_exclusive_group()
    color.add_argument("--color", dest="color", action="store_true", default=None, help="force colour (terminal)")
    color.add_argument("--no-color", dest="color", action="store_false", help="no colour (also: NO_COLOR=1)")


def _load(path: str, what: str) -> RunResult:
    d = Path(path)
    if not d.exists():
        raise InvalidArgument(f"{what} {d} does not exist; pass the directory a run wrote (its --out)")
    if not d.is_dir():
        raise InvalidArgument(
            f"{what} {d} is a file, not a run directory; pass the directory that holds run.json and findings.json"
        )
    return load_run(d)


def run(args: argparse.Namespace) -> int:
    fmt = check_format(args.format)
    result = _load(args.run_dir, "run directory")
    baseline = _load(args.compare, "baseline run directory (--compare)") if args.compare else None
    out = Path(args.out) if args.out else None
    if out is not None and out.is_dir() and not out.is_symlink():
        raise InvalidArgument(f"--out {out} is a directory; pass a file name such as {out / ('report.' + fmt)}")
    if out is not None:
        check_output_path(out)
    # a file gets colour only when forced; stdout gets it on a TTY unless NO_COLOR (see terminal.use_color)
    auto = use_color(sys.stdout) if out is None else False
    color = auto if args.color is None else bool(args.color)
    source_root = args.source_root if args.source_root is not None else str(Path.cwd())
    view = build_view(result, run_dir=args.run_dir, baseline=baseline)
    text = render_view(view, fmt, color=color, source_root=source_root)
    if out is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(out, text)
        print(f"flashcheck report: wrote {fmt} report to {out}", file=sys.stderr)
    return {"findings": EXIT_FINDINGS, "incomplete": EXIT_INCOMPLETE}.get(view.verdict(), EXIT_CLEAN)
