"""Time to first finding for each seed-bug target, each in its own process (a kernel fault cannot leak).

python benchmarks/seed_bugs.py --budget 200 --out $OUT/seed_bugs.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def one(name: str, budget: int, seed: int) -> dict[str, object]:
    sys.path.insert(0, str(ROOT))
    from tests.quality.seed_bugs_gpu import SEED_BUG_TARGETS

    from flashcheck.fuzzing.scenarios import random_steps
    from flashcheck.session import open_session, run_steps

    cls = SEED_BUG_TARGETS[name]
    target = cls()
    t0 = time.perf_counter()
    rec: dict[str, object] = {"target": name, "property": cls.intended, "budget": budget}
    with open_session(target, layers="all", seed=seed) as drv:
        rec["setup_s"] = round(time.perf_counter() - t0, 2)
        t1 = time.perf_counter()
        other: dict[str, int] = {}
        steps = random_steps(target.capacity, budget, seed)
        for i, r in run_steps(drv, steps):  # as sessions and workers run them
            for f in r.findings:
                other[f.id] = other.get(f.id, 0) + 1
            hit = [f for f in r.findings if f.id == cls.intended]
            if hit:
                top = hit[0].stack[-1] if hit[0].stack else None
                rec.update(
                    found=True,
                    steps_to_first=i + 1,
                    seconds_to_first=round(time.perf_counter() - t1, 3),
                    message=hit[0].message,
                    location=str(hit[0].location),
                    stack_top=str(top) if top else None,
                    step=steps[i].to_dict(),
                )
                break
        else:
            rec.update(found=False, steps_to_first=None)
        rec["all_findings"] = other
    return rec


def _doc(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The result file: the command, the date, the environment (device, torch, FlashInfer) and every target's row."""
    from flashcheck.rundir import environment

    return {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "environment": environment(probe=True),
        "results": results,
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--one", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.one:
        import faulthandler

        faulthandler.dump_traceback_later(75, exit=True)  # a hung target shows where it hangs, then exits
        print(json.dumps(one(a.one, a.budget, a.seed), default=str))
        return 0
    sys.path.insert(0, str(ROOT))
    from tests.quality.seed_bugs_gpu import SEED_BUG_TARGETS

    results = []
    for name in sorted(SEED_BUG_TARGETS):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--one", name, "--budget", str(a.budget), "--seed", str(a.seed)],
            check=False,
            capture_output=True,
            text=True,
            env=os.environ.copy(),
        )
        try:
            rec = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            rec = {"target": name, "found": False, "error": proc.stderr[-2000:]}
        rec["wall_s"] = round(time.perf_counter() - t0, 2)
        results.append(rec)
        print(json.dumps(rec, default=str), flush=True)
        if a.out:  # rewritten after every target: a timeout keeps what finished
            Path(a.out).write_text(json.dumps(_doc(results), indent=2, default=str))
    if a.out:
        Path(a.out).write_text(json.dumps(_doc(results), indent=2, default=str))
    print(f"{'target':<36}{'property':<9}{'found':<7}{'steps':>6}{'secs':>8}{'wall':>8}")
    for r in results:
        print(
            f"{r['target']:<36}{r.get('property', ''):<9}{r.get('found')!s:<7}{r.get('steps_to_first')!s:>6}"
            f"{r.get('seconds_to_first', '')!s:>8}{r.get('wall_s')!s:>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
