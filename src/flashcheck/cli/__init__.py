"""Command line: ``flashcheck SUBCOMMAND ...``.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int`` and is listed in
`SUBCOMMANDS`. Exit codes: 0 clean, 1 findings, 2 usage or internal error, 3 environment unavailable, 4 the run
that `flashcheck report` renders did not complete (errors, interrupted, a stop before its budget, a target that
could not run): never clean.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from flashcheck import __version__
from flashcheck.errors import EnvironmentUnavailable, FlashcheckError, UsageError

__all__ = ["EXIT_CLEAN", "EXIT_ENV", "EXIT_FINDINGS", "EXIT_INCOMPLETE", "EXIT_USAGE", "SUBCOMMANDS", "main"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_ENV, EXIT_INCOMPLETE = 0, 1, 2, 3, 4

# name -> (module, one-line help). Modules must not import torch at import time.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "campaign": ("flashcheck.cli.campaign_cmd", "long fuzz campaign: one worker per GPU, crash isolation, resume"),
    "demo": ("flashcheck.cli.demo", "check generated batches against the CPU reference (no GPU needed)"),
    "rules": ("flashcheck.cli.rules", "list every check, or print the page of one (flashcheck rules FC301)"),
    "report": ("flashcheck.cli.report_cmd", "render a run directory as terminal, JSON, JUnit, SARIF, Markdown or HTML"),
    "static": (
        "flashcheck.cli.static_cmd",
        "pre-merge static checks of engine code: host syncs on hot paths, FlashInfer misuse (FC1xx)",
    ),
    "fuzz": ("flashcheck.cli.fuzz_cmd", "fuzz replay sequences against a target; reproducers for every finding"),
    "replay": ("flashcheck.cli.replay_cmd", "re-run a reproducer in this process; exit 1 if the finding reproduces"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"flashcheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the command line as given, for run metadata
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args._run(args))
    except UsageError as exc:
        print(f"flashcheck {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentUnavailable as exc:
        print(f"flashcheck {args.command}: cannot run here: {exc.reason}", file=sys.stderr)
        return EXIT_ENV
    except FlashcheckError as exc:
        print(f"flashcheck {args.command}: {exc}", file=sys.stderr)
        return EXIT_FINDINGS
