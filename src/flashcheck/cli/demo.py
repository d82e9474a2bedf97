"""``flashcheck demo``: generated batches through the layout builder, the CSR property and the CPU reference; runs
anywhere (no GPU). The run itself is `flashcheck.cli.demo_run` (it needs numpy, which this module does not import)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=60, help="generated batches (default 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the whole run (printed in the header)")
    p.add_argument("--no-plant", dest="plant", action="store_false", help="do not plant the seed-003 bug")


def run(args: argparse.Namespace) -> int:
    from flashcheck.cli.demo_run import run as run_demo

    return run_demo(args)
