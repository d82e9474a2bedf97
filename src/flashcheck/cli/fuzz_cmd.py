"""``flashcheck fuzz``: the replay state machine against one target, outside pytest, into a run directory.

Writes ``OUT/run.json``, ``OUT/findings.json``, ``OUT/samples.jsonl`` and ``OUT/repros/SIG.json``; a directory that
already holds a run is refused unless ``--resume`` (its findings are kept). Exit codes as every subcommand
(`flashcheck.cli`): 1 with findings (the shrunk program and the replay command are printed), 0 clean, 2 bad input,
3 when the target cannot run here, 4 when a selected check was never exercised (``run.json`` ``"checks_by_target"``,
`flashcheck.exercised`), 130 interrupted (the run directory then says so).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from flashcheck.cli import EXIT_CLEAN, EXIT_FINDINGS, EXIT_INCOMPLETE
from flashcheck.cli._common import Progress, add_async_pressure, add_config, add_out, parse_json_object
from flashcheck.errors import InvalidArgument

if TYPE_CHECKING:
    from flashcheck.fuzzing.recorder import FindingLog
    from flashcheck.rundir import RunWriter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="cpu-reference", help="built-in name or module:Class (default cpu-reference)")
    add_config(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--time", metavar="DURATION", help="time budget: 30s, 5m, 1h30m")
    g.add_argument("--examples", type=int, metavar="N", help="budget in examples (replay sequences)")
    g.add_argument("--budget", help="examples (200) or time (30s, 5m); default: the profile's")
    p.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    p.add_argument(
        "--profile",
        default="auto",
        choices=("ci", "gpu", "nightly", "auto"),
        help="examples and steps per example: ci (fast), gpu (no deadline, kernels compile on first use), nightly "
        "(long); auto: gpu on a CUDA machine, ci otherwise",
    )
    p.add_argument(
        "--layers",
        default="all",
        choices=("off", "cheap", "all", "races"),
        help="runtime detection layers: off (properties only), cheap (sync debug, trace, allocator), all (adds "
        "dispatch, CUPTI and the pinned-staging race detector)",
    )
    add_async_pressure(p)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="default: CUDA when available")
    add_out(p, "run directory (default runs/fuzz-YYYYmmdd-HHMMSS)", metavar="DIR")
    p.add_argument("--resume", action="store_true", help="add to the run already in --out (its findings are kept)")


def _budget(args: argparse.Namespace) -> str | None:
    if args.examples is not None:
        if args.examples < 1:
            raise InvalidArgument(f"--examples {args.examples}: give at least 1")
        return str(args.examples)
    if args.time is not None:
        from flashcheck.campaign.options import parse_duration

        return f"{parse_duration(args.time):g}s"
    if args.budget is not None:
        from flashcheck.fuzzing.options import parse_budget

        parse_budget(args.budget)  # a clear error now, not after the target is set up
    return str(args.budget) if args.budget is not None else None


def _checks(layers: str, device: str | None) -> list[str]:
    from flashcheck.driver import checks_run
    from flashcheck.session import default_device
    from flashcheck.watchdog import default_step_timeout

    dev = device or default_device()
    return checks_run(layers, watchdog=default_step_timeout(dev) is not None, cuda=dev.startswith("cuda"))


def run(args: argparse.Namespace) -> int:
    from flashcheck.cli._common import require_runtime

    require_runtime("fuzz")
    from flashcheck.fuzzing.options import active_options, set_active_options
    from flashcheck.fuzzing.recorder import FindingLog
    from flashcheck.pressure import parse_pressure_us
    from flashcheck.rundir import RunWriter
    from flashcheck.targets.registry import make_target

    config = parse_json_object(args.config, "--config")
    budget = _budget(args)
    pressure = parse_pressure_us(args.async_pressure_us)
    if args.resume and not args.out:
        raise InvalidArgument("--resume needs the --out of the run to add to")
    name = make_target(args.target, **config).name  # bad names and configuration keys fail here, before any work
    device = None if args.device == "auto" else args.device
    if device is not None:
        from flashcheck.session import check_device

        check_device(device)  # before the run directory: a CUDA run on a machine without a GPU is exit 3
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    out = Path(args.out or time.strftime("runs/fuzz-%Y%m%d-%H%M%S"))
    writer = RunWriter(
        out,
        {
            "kind": "fuzz",
            "command": " ".join(sys.argv),
            "seed": seed,
            "target": args.target,
            "target_config": config,
            "budget": budget,
            "targets": [name],
            "checks": _checks(args.layers, device),
            "async_pressure_us": pressure,
        },
        resume=args.resume,
    )
    log = FindingLog(writer.dir / "repros")
    print(
        f"flashcheck fuzz: target {args.target}, seed {seed}, budget {budget or 'per profile'}, "
        f"profile {args.profile}, out {writer.dir}",
        flush=True,
    )
    previous = set_active_options(active_options().with_(out_dir=writer.dir / "repros", async_pressure_us=pressure))
    try:
        return _fuzz(args, config, budget, device, seed, writer, log)
    except BaseException as exc:  # recorded so that no report can read this run as clean, then passed on
        with contextlib.suppress(Exception):  # what the sessions exercised before the run broke off
            _record_sessions(writer)
        if isinstance(exc, KeyboardInterrupt):
            writer.error("interrupted by the user (Ctrl-C)")
        else:
            writer.error(f"{type(exc).__name__}: {exc}")
        writer.close(finished=False)
        raise
    finally:
        set_active_options(previous)


def _fuzz(
    args: argparse.Namespace,
    config: dict[str, object],
    budget: str | None,
    device: str | None,
    seed: int,
    writer: RunWriter,
    log: FindingLog,
) -> int:
    from flashcheck.fuzzing.recorder import describe
    from flashcheck.fuzzing.stateful import FuzzFailure, close_sessions, fuzz_target
    from flashcheck.scenario import Step, StepResult

    close_sessions()  # sessions (and their layer facts) of an earlier run in this process are not this run's
    progress = Progress("flashcheck fuzz", sys.stderr)
    steps = [0]

    def sample(step: Step, result: StepResult) -> None:
        steps[0] += 1
        progress.tick(f"{steps[0]} steps run, no finding so far")
        if result.sample is not None:
            writer.add_sample(result.sample)

    try:
        report = fuzz_target(
            args.target,
            config=config,
            budget=budget,
            seed=seed,
            profile=args.profile,
            layers=args.layers,
            device=device,
            log=log,
            check=sample,
        )
    except FuzzFailure as exc:
        progress.done()
        _record_sessions(writer)
        writer.add_findings(exc.findings)
        writer.close(findings=len(exc.findings), steps=steps[0])
        print(describe(exc.records))
        for note in getattr(exc, "__notes__", []):
            print(note)
        print(f"seed {seed}: rerun with --seed {seed}")
        return EXIT_FINDINGS
    progress.done()
    _record_sessions(writer)
    writer.close(rounds=report.rounds, elapsed=report.elapsed, steps=steps[0])
    ran = f"{report.rounds} round(s) of {report.budget}, {steps[0]} steps in {report.elapsed:.1f}s (seed {seed})"
    from flashcheck.reports import build_view
    from flashcheck.rundir import RunResult

    view = build_view(RunResult(writer.meta, []))
    if view.verdict() == "incomplete":  # no finding, but not every selected check ran: never called clean
        print(f"incomplete: {ran}; " + "; ".join(view.incomplete_reasons()))
        return EXIT_INCOMPLETE
    print(f"clean: {ran}")
    return EXIT_CLEAN


def _record_sessions(writer: RunWriter) -> None:
    """The run's detection-layer facts and what its sessions exercised of the checks, per target (run.json)."""
    from flashcheck.exercised import add_exercised
    from flashcheck.fuzzing.stateful import session_exercised, session_layer_facts

    writer.meta.setdefault("environment", {}).update(session_layer_facts())
    add_exercised(writer.meta, session_exercised())
