"""Run every built-in target through generated capture/replay/eager scenarios on this machine.

Records, per target: steps executed, rejected steps, findings by check ID (with the first message of each), wall
time and steps/s, or why the target could not run: the version matrix (run it once per FlashInfer version, then
`python benchmarks/render_evidence.py`) and the smoke test of the targets.

    python benchmarks/target_matrix.py --steps 200 --out reports/raw/target_matrix-0.6.13.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections import Counter
from typing import Any


def make_checker(mode: str, device: str) -> Any:
    from flashcheck.runtime.api import NullChecker

    try:
        from flashcheck.runtime import Checker  # type: ignore[attr-defined]
    except ImportError:
        Checker = None
    if Checker is not None and mode != "null":
        return Checker(layers=mode, device=device)
    import torch

    class PlainArena:  # no guard zones: used only when the runtime checker is not available
        def workspace(self, name: str, nbytes: int, *, device: Any, kind: str = "float", zero: bool = True) -> Any:
            return torch.zeros(nbytes, dtype=torch.uint8, device=device)

        def arm(self) -> None:
            pass

        def scan(self, step: int | None = None) -> tuple[list[Any], dict[str, Any]]:
            return [], {}

    return NullChecker(PlainArena())


def run_target(name: str, steps: int, seed: int, mode: str, device: str) -> dict[str, Any]:
    from flashcheck.errors import EnvironmentUnavailable
    from flashcheck.fuzzing.scenarios import random_steps
    from flashcheck.known import split_known
    from flashcheck.session import run_steps

    try:
        import flashinfer

        version = str(flashinfer.__version__)
    except ImportError:
        version = ""
    from flashcheck.driver import Driver
    from flashcheck.targets.registry import make_target

    rec: dict[str, Any] = {"target": name, "checker": mode}
    t0 = time.perf_counter()
    try:
        target = make_target(name)
        checker = make_checker(mode, device)
        enter = getattr(checker, "__enter__", None)
        if enter is not None:
            enter()
        try:
            drv = Driver(target, checker, device=device, seed=seed)
            drv.setup()
            rec["setup_s"] = round(time.perf_counter() - t0, 2)
            plan = random_steps(target.capacity, steps, seed)
            found: Counter[str] = Counter()
            known: Counter[str] = Counter()
            first: dict[str, str] = {}
            rejected: Counter[str] = Counter()
            ops: Counter[str] = Counter()
            t1 = time.perf_counter()

            for i, r in run_steps(drv, plan):  # as sessions and workers run them
                st = plan[i]
                ops[st.op] += 1
                if r.rejected:
                    rejected[r.rejected[:120]] += 1
                unexpected, hits = split_known(r.findings, name, version)
                for f in unexpected:
                    found[f.id] += 1
                    top = next((str(fr) for fr in reversed(f.stack) if "flashcheck" not in fr.file), None)
                    first.setdefault(f.id, f"step {i} {st.to_dict()}: {f.message} [at {f.location}; {top}]")
                for f, k in hits:
                    known[f.id] += 1
                    first.setdefault(f"known {f.id}", f"step {i}: {f.message} -- {k.reason}")
            dt = time.perf_counter() - t1
            rec.update(
                status="ran",
                steps=len(plan),
                ops=dict(ops),
                steps_per_s=round(len(plan) / dt, 1),
                run_s=round(dt, 2),
                findings=dict(found),
                known=dict(known),
                first_finding=first,
                rejected=dict(rejected),
                config=dict(target.config()),
            )
        finally:
            exit_ = getattr(checker, "__exit__", None)
            if exit_ is not None:
                exit_(None, None, None)
    except EnvironmentUnavailable as exc:
        rec.update(status="skipped", reason=str(exc))
    except Exception as exc:
        rec.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
    rec["wall_s"] = round(time.perf_counter() - t0, 2)
    return rec


def main() -> int:
    from flashcheck.targets.registry import GPU_TARGETS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default=",".join(GPU_TARGETS))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checker", default="all", choices=["null", "cheap", "all"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from flashcheck.rundir import environment

    env = environment(probe=True)
    results = []
    for name in a.targets.split(","):
        rec = run_target(name, a.steps, a.seed, a.checker, a.device)
        results.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k not in ("traceback", "config")}), flush=True)
        if rec.get("traceback"):
            print(rec["traceback"], file=sys.stderr, flush=True)
    doc = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "environment": env, "results": results}
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(doc, fh, indent=2, default=str)
    print(f"{'target':<18}{'status':<9}{'steps':>6}{'steps/s':>9}  findings / known / reason")
    for r in results:
        tail = (
            f"{r.get('findings')} known={r.get('known')}" if r["status"] == "ran" else r.get("reason") or r.get("error")
        )
        print(f"{r['target']:<18}{r['status']:<9}{r.get('steps', 0):>6}{r.get('steps_per_s', 0):>9}  {tail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
