"""``flashcheck rules [ID]``: list every check, or print one check's page."""

from __future__ import annotations

import argparse

from flashcheck.catalogue import all_checks, get_check


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("check", nargs="?", help="a check ID (FC301) or name (csr-well-formed)")


def run(args: argparse.Namespace) -> int:
    if args.check:
        print(get_check(args.check).page())
        return 0
    for c in all_checks():
        print(f"{c.id}  {c.kind:<8}  {c.name:<32}  {c.summary}")
    return 0
