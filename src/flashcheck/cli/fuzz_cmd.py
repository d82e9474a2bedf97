"""``flashcheck fuzz``: the replay state machine against one target, outside pytest, into a run directory.

Writes ``OUT/run.json``, ``OUT/findings.json``, ``OUT/samples.jsonl`` and ``OUT/repros/SIG.json``. Exit 1 with
findings (the shrunk program and the replay command are printed), 0 clean, 3 when the target cannot run here.
"""

from __future__ import annotations

import argparse
import random
import sys
from typing import TYPE_CHECKING

from flashcheck.cli import EXIT_CLEAN, EXIT_FINDINGS
from flashcheck.cli._common import parse_json_object

if TYPE_CHECKING:
    from flashcheck.fuzz.recorder import FindingLog
    from flashcheck.rundir import RunWriter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="cpu-reference", help="built-in name or module:Class (default cpu-reference)")
    p.add_argument("--config", default=None, help="target configuration as JSON, e.g. '{\"buckets\": [1, 2, 4]}'")
    p.add_argument("--budget", default=None, help="examples (200) or time (30s, 5m); default: the profile's")
    p.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    p.add_argument("--profile", default="auto", choices=("ci", "gpu", "nightly", "auto"))
    p.add_argument("--layers", default="all", choices=("off", "cheap", "all"))
    p.add_argument("--device", default=None, help="cuda or cpu (default: CUDA when available)")
    p.add_argument("--out", default="flashcheck-fuzz", help="run directory (default ./flashcheck-fuzz)")


def run(args: argparse.Namespace) -> int:
    from flashcheck.fuzz.options import active_options, set_active_options
    from flashcheck.fuzz.recorder import FindingLog
    from flashcheck.rundir import RunWriter

    config = parse_json_object(args.config, "--config")
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    writer = RunWriter(
        args.out,
        {
            "kind": "fuzz",
            "command": " ".join(sys.argv),
            "seed": seed,
            "target": args.target,
            "target_config": config,
            "budget": args.budget,
        },
    )
    log = FindingLog(writer.dir / "repros")
    print(
        f"flashcheck fuzz: target {args.target}, seed {seed}, budget {args.budget or 'per profile'}, "
        f"profile {args.profile}, out {writer.dir}"
    )
    previous = set_active_options(active_options().with_(out_dir=writer.dir / "repros"))
    try:
        return _fuzz(args, config, seed, writer, log)
    finally:
        set_active_options(previous)


def _fuzz(args: argparse.Namespace, config: dict[str, object], seed: int, writer: RunWriter, log: FindingLog) -> int:
    from flashcheck.fuzz.recorder import describe
    from flashcheck.fuzz.stateful import FuzzFailure, fuzz_target
    from flashcheck.scenario import Step, StepResult

    def sample(step: Step, result: StepResult) -> None:
        if result.sample is not None:
            writer.add_sample(result.sample)

    try:
        report = fuzz_target(
            args.target,
            config=config,
            budget=args.budget,
            seed=seed,
            profile=args.profile,
            layers=args.layers,
            device=args.device,
            log=log,
            check=sample,
        )
    except FuzzFailure as exc:
        writer.add_findings(exc.findings)
        writer.close(findings=len(exc.findings))
        print(describe(exc.records))
        for note in getattr(exc, "__notes__", []):
            print(note)
        print(f"seed {seed}: rerun with --seed {seed}")
        return EXIT_FINDINGS
    writer.close(rounds=report.rounds, elapsed=report.elapsed)
    print(f"clean: {report.rounds} round(s) of {report.budget} in {report.elapsed:.1f}s (seed {seed})")
    return EXIT_CLEAN
