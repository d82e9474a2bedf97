"""``flashcheck static PATH...``: the pre-merge verifier (no GPU, no torch import).

Its result is a run like any other (`StaticResult.to_run`): every report format of `flashcheck.reports` renders it,
and ``--run-dir DIR`` saves it for ``flashcheck report DIR``. Exit codes: 0 no new findings, 1 new findings, 2 usage
error (bad option or configuration), 5 a rule crashed (the other rules still report; the run reads as incomplete).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from flashcheck._files import check_output_path
from flashcheck.cli import EXIT_CLEAN, EXIT_FINDINGS, EXIT_INTERNAL
from flashcheck.cli._common import add_out
from flashcheck.errors import InvalidArgument
from flashcheck.findings import atomic_write_text
from flashcheck.reports import FORMAT_ALIASES, FORMATS, build_view, render_view
from flashcheck.reports.terminal import use_color
from flashcheck.rundir import RunResult, RunWriter
from flashcheck.verifier.baseline import write_baseline
from flashcheck.verifier.cache import CACHE_ENV, DEFAULT_DIR
from flashcheck.verifier.config import find_pyproject, load_config
from flashcheck.verifier.engine import check_paths


def _ids(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _jobs(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"--jobs takes a whole number of processes (0: one per CPU), got {value!r}")
    return n


def _format(value: str) -> str:
    name = FORMAT_ALIASES.get(value, value)
    if name not in FORMATS:
        raise argparse.ArgumentTypeError(f"unknown format {value!r}; choose one of {', '.join(FORMATS)}")
    return name


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", default=["."], metavar="PATH", help="files or directories (default: .)")
    p.add_argument(
        "--select",
        type=_ids,
        action="extend",
        metavar="IDS",
        help="rule IDs, prefixes (FC1, FC10) or names to run, comma separated (replaces the config)",
    )
    p.add_argument(
        "--ignore",
        type=_ids,
        action="extend",
        metavar="IDS",
        help="rule IDs, prefixes or names to skip, comma separated (replaces the config)",
    )
    p.add_argument(
        "--format",
        "-f",
        default="concise",
        type=_format,
        metavar="FORMAT",
        help=f"one of {', '.join(FORMATS)} (default concise: one file:line:col line per finding)",
    )
    add_out(p, "write the report to FILE (atomically) instead of stdout", metavar="FILE")
    p.add_argument("--run-dir", metavar="DIR", help="also save the result as a run directory (flashcheck report DIR)")
    p.add_argument("--baseline", metavar="FILE", help="ignore findings recorded in FILE (only new ones fail)")
    p.add_argument(
        "--write-baseline", action="store_true", help="record every current finding in the --baseline file and exit 0"
    )
    p.add_argument(
        "--config",
        metavar="PYPROJECT",
        help="pyproject.toml to read [tool.flashcheck.static] from (default: nearest to the first PATH)",
    )
    p.add_argument(
        "--jobs",
        "-j",
        type=_jobs,
        metavar="N",
        help="processes to use (default: one per CPU): with more than one, the model is built in a forked process, "
        "FC101 runs beside the other rules, and new summary-cache entries are written meanwhile",
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help=f"summary cache: one entry per file content, so a run re-parses only changed files "
        f"(default: ${CACHE_ENV}, else {DEFAULT_DIR} next to the pyproject.toml or in the current directory)",
    )
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the summary cache")
    p.add_argument(
        "--no-default-roots",
        action="store_true",
        help="use only configured and @hot_path roots, not the built-in engine name patterns",
    )


def _cache_dir(option: str | None, pyproject: Path | None) -> str:
    """``--cache-dir``, else ``$FLASHCHECK_STATIC_CACHE_DIR``, else ``.flashcheck_cache`` next to the
    configuration (like ruff's ``.ruff_cache`` and ``RUFF_CACHE_DIR``)."""
    if option:
        return option
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    return str((pyproject.resolve().parent if pyproject is not None else Path.cwd()) / DEFAULT_DIR)


def _save(run_dir: Path, run: RunResult) -> None:
    """The result as a run directory (run.json, findings.json) that `flashcheck report` renders."""
    writer = RunWriter(run_dir, {k: v for k, v in run.meta.items() if k not in ("finished", "stats")})
    writer.add_findings(run.findings)
    writer.close(**run.meta.get("stats", {}))


def run(args: argparse.Namespace) -> int:
    if args.out:
        check_output_path(args.out)  # before the analysis: a device, FIFO or link is never replaced
    pyproject = Path(args.config) if args.config else find_pyproject(Path(args.paths[0]))
    config = load_config(pyproject).with_overrides(
        select=tuple(args.select) if args.select else None,
        ignore=tuple(args.ignore) if args.ignore else None,
        baseline=args.baseline,
        default_roots=False if args.no_default_roots else None,
        jobs=args.jobs,
        cache_dir=None if args.no_cache else _cache_dir(args.cache_dir, pyproject),
    )
    if args.write_baseline and not config.baseline:
        raise InvalidArgument(
            "--write-baseline needs a baseline path: pass --baseline FILE or set baseline in [tool.flashcheck.static]"
        )
    if config.baseline and not args.write_baseline and not Path(config.baseline).exists():
        raise InvalidArgument(
            f"baseline {config.baseline} does not exist; create it with "
            f"`flashcheck static --baseline {config.baseline} --write-baseline`"
        )
    result = check_paths(args.paths, config.with_overrides(baseline="") if args.write_baseline else config)
    for err in result.internal_errors:
        print(f"flashcheck static: internal error: {err}", file=sys.stderr)
    if args.write_baseline:
        n = write_baseline(str(config.baseline), result.all_findings)
        print(f"flashcheck static: wrote {n} finding(s) to baseline {config.baseline}", file=sys.stderr)
        return EXIT_INTERNAL if result.internal_errors else EXIT_CLEAN
    summary = (
        f"{len(result.findings)} finding(s) in {len(result.files)} file(s), {result.lines} lines, "
        f"{result.roots} hot-path roots, {result.seconds:.1f}s, {result.cached} file(s) from the cache"
        f" ({result.suppressed} suppressed, {result.baselined} in baseline)"
    )
    command = "flashcheck " + " ".join(getattr(args, "argv", sys.argv[1:]))
    run_result = result.to_run({"command": command, "paths": list(args.paths), "root": str(config.root)})
    if args.run_dir:
        _save(Path(args.run_dir), run_result)
    view = build_view(run_result)
    color = use_color(sys.stdout) if not args.out and args.format == "terminal" else False  # terminal only
    text = render_view(view, args.format, color=color, source_root=config.root)
    if args.out:
        atomic_write_text(args.out, text)
    else:
        sys.stdout.write(text)
    human = not args.out and args.format in ("concise", "terminal")  # machine formats keep stdout parseable
    print(summary, file=sys.stdout if human else sys.stderr)
    if result.internal_errors:
        return EXIT_INTERNAL
    return EXIT_FINDINGS if result.findings else EXIT_CLEAN
