"""Command line: ``flashcheck SUBCOMMAND ...``.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int`` and is listed in
`SUBCOMMANDS`. One exit-code contract for every subcommand:

- 0 clean: everything asked for ran and found nothing (``replay``: the finding did not come back);
- 1 findings (``replay``: the finding reproduced);
- 2 usage or input error: a bad flag, value, file or output path, with a one-line message and no traceback;
- 3 this environment cannot run it (no GPU, no FlashInfer, a kernel that cannot build here);
- 4 incomplete: the run did not complete (errors, interrupted, stopped before its budget, a target that could not
  run), so it is never clean;
- 5 flashcheck itself failed: a bug in flashcheck, reported in one line with the traceback saved to a file;
- 130 interrupted by Ctrl-C (a campaign stays resumable); 141 the reader of the output went away (``| head``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence

from flashcheck import __version__
from flashcheck.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_CLEAN,
    EXIT_ENV,
    EXIT_FINDINGS,
    EXIT_INCOMPLETE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    ContextPoisoned,
    EnvironmentUnavailable,
    UsageError,
    ViolationFound,
)

__all__ = [
    "EXIT_CLEAN",
    "EXIT_ENV",
    "EXIT_FINDINGS",
    "EXIT_INCOMPLETE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "SUBCOMMANDS",
    "main",
]


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
    "workspace": (
        "flashcheck.cli.workspace_cmd",
        "worst-case FlashInfer workspace of an engine configuration, with witness batches (FC306)",
    ),
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
    except (ViolationFound, ContextPoisoned) as exc:
        print(f"flashcheck {args.command}: {exc}", file=sys.stderr)
        return EXIT_FINDINGS
    except ModuleNotFoundError as exc:
        if exc.name not in ("torch", "flashinfer"):
            return _internal(args.command, exc)
        print(
            f"flashcheck {args.command}: cannot run here: {exc.name} is not installed: pip install "
            "'flashcheck[torch]' (or 'flashcheck[gpu]' for FlashInfer)",
            file=sys.stderr,
        )
        return EXIT_ENV
    except KeyboardInterrupt:
        print(f"flashcheck {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # a bug in flashcheck (FlashcheckError included): one line here, the traceback in a file
        return _internal(args.command, exc)


def _internal(command: str, exc: BaseException) -> int:
    where = _save_traceback(command)
    print(
        f"flashcheck {command}: internal error: {type(exc).__name__}: {exc} (traceback in {where}; please report "
        "it with that file)",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def _quiet_stdout() -> None:
    """The reader of stdout went away: point stdout at /dev/null so that Python's exit flush cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _save_traceback(command: str) -> str:
    """Write the current exception's traceback to a temporary file and return its path (or "stderr" when no file
    can be written, after printing it there)."""
    text = traceback.format_exc()
    try:
        fd, path = tempfile.mkstemp(prefix=f"flashcheck-{command}-", suffix=".traceback.txt")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        return path
    except OSError:
        print(text, file=sys.stderr)
        return "stderr"
