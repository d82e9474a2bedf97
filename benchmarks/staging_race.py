"""GPU evidence for FC204 and async pressure: the same generated steps against a target that rewrites a pinned mirror
while its copy is in flight, and against clean built-in targets, under four settings.

  baseline        layers=cheap, no pressure: what fuzzing alone sees (the copy usually wins the race)
  staging         layers=races (the staging layer holds each tracked copy in flight): FC204 on the racing replays
  pressure        layers=cheap, --async-pressure-us: the race shows as FC303
  staging+press.  both

Per setting: steps, replays, findings by check ID, the first step of each, steps/s; for clean targets also the
copies the staging layer tracked (a clean verdict with zero tracked copies would be vacuous).

    python benchmarks/staging_race.py --steps 40 --out reports/raw/staging_race-0.6.13.json
    python benchmarks/staging_race.py --render      # reports/staging-race.md from reports/raw/staging_race-*.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

SETTINGS: dict[str, tuple[str, float | None]] = {
    "baseline": ("cheap", None),
    "staging": ("races", None),
    "pressure": ("cheap", 2000.0),
    "staging+pressure": ("races", 2000.0),
}
FAULTY = "faulty_engine_gpu:PinnedMirrorRewrittenInFlight"
ROOT = Path(__file__).resolve().parents[1]
RAW, REPORT = ROOT / "reports" / "raw", ROOT / "reports" / "staging-race.md"


def _counts(d: dict[str, int], first: dict[str, int] | None = None) -> str:
    if not d:
        return "none"
    return ", ".join(
        f"{k} x{v}" + (f" (first at step {first[k]})" if first and k in first else "") for k, v in d.items()
    )


def render(paths: list[Path]) -> str:
    """The page: one table per result file, every number read from it."""
    out = [
        "# Staging races: FC204 and async pressure on the GPU",
        "",
        "Rendered by `python benchmarks/staging_race.py --render` from `reports/raw/staging_race-*.json`. "
        "The faulty target rewrites a pinned mirror right after enqueuing its non_blocking copy; the clean targets are "
        "built-ins. Settings: "
        + "; ".join(f"{n} = layers {lay}, pressure {p or 'off'}" for n, (lay, p) in SETTINGS.items())
        + ".",
    ]
    for path in paths:
        doc = json.loads(path.read_text(encoding="utf-8"))
        out += [
            "",
            f"## `{path.name}`",
            "",
            f"- command: `{doc['command']}`",
            f"- device {doc['device']}, torch {doc['torch']}, FlashInfer {doc['flashinfer']}, date {doc['date']}",
            "",
            "| target | setting | steps (replays) | findings | known upstream | copies tracked | steps/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in doc["runs"]:
            tracked = "-" if r["tracked_copies"] is None else str(r["tracked_copies"])
            out.append(
                f"| {r['target']} | {r['setting']} | {r['steps']} ({r['replays']}) | "
                f"{_counts(r['findings'], r['first_step'])} | {_counts(r['known'])} | {tracked} | {r['steps_per_s']} |"
            )
    return "\n".join(out) + "\n"


def run(target: str, layers: str, pressure: float | None, steps: int, seed: int) -> dict[str, Any]:
    from flashcheck.fuzzing.scenarios import random_steps
    from flashcheck.known import split_known
    from flashcheck.session import open_session
    from flashcheck.targets.registry import make_target

    tgt = make_target(target)
    found: Counter[str] = Counter()
    first: dict[str, int] = {}
    known: Counter[str] = Counter()
    replays = 0
    t0 = time.perf_counter()
    with open_session(tgt, layers=layers, seed=seed, async_pressure_us=pressure) as drv:  # type: ignore[arg-type]
        t1 = time.perf_counter()
        for i, s in enumerate(random_steps(tgt.capacity, steps, seed=99)):
            r = drv.execute(s, i)
            replays += s.op == "replay"
            unexpected, kn = split_known(r.findings, tgt.name)
            for f in unexpected:
                found[f.id] += 1
                first.setdefault(f.id, i)
            for f, _entry in kn:
                known[f.id] += 1
        elapsed = time.perf_counter() - t1
        hook = getattr(drv.checker, "hook", lambda _n: None)("staging")
        tracked = getattr(hook, "tracked", None)
    return {
        "target": tgt.name,
        "layers": layers,
        "async_pressure_us": pressure,
        "steps": steps,
        "replays": replays,
        "findings": dict(found),
        "first_step": first,
        "known": dict(known),
        "tracked_copies": tracked,
        "setup_s": round(t1 - t0, 2),
        "steps_per_s": round(steps / elapsed, 2) if elapsed > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--clean", default="decode-tc,prefill-fa2,mla-fa2", help="clean targets to run")
    p.add_argument("--out", type=Path, help="where the JSON result goes (required unless --render)")
    p.add_argument("--render", action="store_true", help="only write reports/staging-race.md from reports/raw")
    args = p.parse_args(argv)
    if args.render:
        REPORT.write_text(render(sorted(RAW.glob("staging_race-*.json"))), encoding="utf-8")
        print(f"wrote {REPORT}")
        return 0
    if args.out is None:
        p.error("--out is required to run the benchmark")
    import flashinfer
    import torch

    rows = []
    for target in [FAULTY, *[c for c in args.clean.split(",") if c]]:
        for name, (layers, pressure) in SETTINGS.items():
            rec = {"setting": name, **run(target, layers, pressure, args.steps, args.seed)}
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    doc = {
        "kind": "staging_race",
        "command": " ".join(["python3", *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "flashinfer": str(flashinfer.__version__),
        "runs": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
