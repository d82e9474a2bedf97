"""``flashcheck replay FILE``: re-run a reproducer deterministically in this (fresh) process.

Exit codes: 1 the recorded finding reproduced, 0 it did not (fixed, or environment-dependent), 2 the file is not a
reproducer, 3 this machine cannot run the target. Prints the findings at the failing step and a pytest snippet.
"""

from __future__ import annotations

import argparse

from flashcheck.cli import EXIT_CLEAN, EXIT_FINDINGS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="reproducer JSON (written by the fuzzer, a campaign or pytest)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: CUDA when available)")
    p.add_argument("--no-snippet", dest="snippet", action="store_false", help="do not print the pytest snippet")
    p.add_argument(
        "--sanitizer",
        metavar="TOOL",
        default=None,
        help="also re-run it under compute-sanitizer (memcheck, racecheck, initcheck, synccheck) to name "
        "the kernel and address of a fault",
    )


def run(args: argparse.Namespace) -> int:
    from flashcheck.repro import load_repro, pytest_snippet, replay_repro

    repro = load_repro(args.file)
    sc, want = repro["scenario"], repro.get("finding") or {}
    print(f"flashcheck replay: {args.file}")
    print(
        f"  target {sc.get('target')}, seed {sc.get('seed', 0)}, {len(sc.get('steps', []))} step(s), "
        f"failing step {repro['step']}, layers {repro.get('layers', 'all')}"
        + (f", async pressure {repro['async_pressure_us']:g} us" if repro.get("async_pressure_us") else "")
    )
    print(f"  recorded: {want.get('id', '?')} {want.get('name', '')}: {want.get('message', '')}")
    env = repro.get("environment", {})
    if env:
        print("  recorded on: " + ", ".join(f"{k} {v}" for k, v in sorted(env.items())))
    from flashcheck.cli._common import require_runtime

    require_runtime("replay")  # what was recorded is printed above; running it needs the runtime
    found, hit = replay_repro(repro, device=args.device)
    for f in found:
        print(f)
    if hit:
        print(f"reproduced: {want.get('id')} came back at step {repro['step']}")
    else:
        print(
            f"not reproduced: {len(found)} finding(s) at step {repro['step']}, none matches "
            f"{want.get('id')} ({want.get('evidence', {}).get('check', '')})"
        )
    if args.sanitizer:
        from flashcheck.sanitizer import run_under_sanitizer

        report = run_under_sanitizer(args.file, args.sanitizer, device=args.device)
        print(f"\ncompute-sanitizer --tool {args.sanitizer}: {report.count} error(s)")
        for what, where, addr, n in report.distinct():
            print(f"  {what}" + (f" (x{n} printed)" if n > 1 else "") + f"\n    in {where}")
            if addr:
                print(f"    {addr}")
        if not report.errors and report.count:
            print(report.output[-4000:])
        hit = hit or report.count > 0
    if args.snippet:
        print("\npytest snippet (fails while the bug is there):\n")
        print(pytest_snippet(repro, args.file))
    return EXIT_FINDINGS if hit else EXIT_CLEAN
