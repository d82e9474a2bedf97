"""Hunt FlashInfer defects that serving engines trip over, one class at a time, for a fixed time budget.

Each class runs in its own process (a fault in one cannot poison the others) until its share of ``--budget-s``,
records every trial it ran, and reports found / not found with the minimized reproducer of the first hit:

  deterministic-graph-decode  tensor-core decode planned for CUDA graphs with ``disable_split_kv=True`` at small
                              batches, on an int workspace that a larger split-KV plan used before (stale scheduler
                              entries past the initialized grid); output rows compared with the fp32 reference, rows
                              past the batch guarded with NaN
  mla-long-kv                 MLA (fa2) eager and graph steps with KV lengths around and past 16384
  non-monotone-kv-indptr      decode plans given a kv_indptr with one decreasing entry: rejected, or accepted
  boundary-page-counts        decode/prefill/MLA steps whose lengths sit on page and bucket boundaries
  int-workspace-replanned-in-flight  plan A, run A, plan B with the stream held: the pinned int workspace is
                              rewritten by plan B before plan A's copy of it ran; run A compared with its reference

    python benchmarks/defect_hunt.py --budget-s 220 --out reports/raw/defect_hunt-0.6.13.json
    python benchmarks/render_defect_hunt.py reports/raw/defect_hunt-*.json --out reports/defect-hunt.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from defect_classes import CLASSES, Hunt

MARGIN_S = 8.0  # a class stops trying this long before its share ends (result written, process exits)
# relative shares of the budget: MLA and the driver-based classes pay for more kernel compiles on a cold cache
WEIGHTS = {
    "deterministic-graph-decode": 1.0,
    "int-workspace-replanned-in-flight": 0.8,
    "non-monotone-kv-indptr": 0.8,
    "mla-long-kv": 1.3,
    "boundary-page-counts": 1.1,
}


def run_class(name: str, budget_s: float, seed: int, out: Path) -> int:
    """Child: run one class until its deadline, rewriting `out` after every trial."""
    hunt = Hunt(name, deadline=time.monotonic() + max(budget_s - MARGIN_S, 1.0), seed=seed, sink=out)
    fn: Callable[[Hunt], None] = CLASSES[name][0]
    try:
        fn(hunt)
        hunt.status = "finished" if hunt.found is None else "found"
    except Exception as exc:
        hunt.status = "error"
        hunt.error = f"{type(exc).__name__}: {exc}"
        hunt.traceback = traceback.format_exc(limit=8)
    hunt.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--budget-s", type=float, default=200.0, help="total wall time for all classes, seconds (default 200)"
    )
    p.add_argument("--classes", default=",".join(CLASSES), help="comma-separated classes (default all)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--out", type=Path, help="raw JSON (default reports/raw/defect_hunt-<flashinfer version>.json)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.budget_s <= 0:
        p.error(f"--budget-s {args.budget_s}: give a positive number of seconds")
    names = [c.strip() for c in args.classes.split(",") if c.strip()]
    unknown = [c for c in names if c not in CLASSES]
    if unknown:
        p.error(f"unknown class(es) {', '.join(unknown)}; known: {', '.join(CLASSES)}")
    if args.child:
        return run_class(args.child, args.budget_s, args.seed, args.child_out)
    from flashcheck.rundir import environment

    versions = environment(probe=True)
    out = args.out or Path(f"reports/raw/defect_hunt-{versions.get('flashinfer', 'not-installed')}.json")
    results = []
    t0 = time.monotonic()
    for i, name in enumerate(names):
        # the time a class leaves unused (found early, or finished) goes to the classes after it
        left = args.budget_s - (time.monotonic() - t0)
        share = max(left * WEIGHTS[name] / sum(WEIGHTS[n] for n in names[i:]), 5.0)
        tmp = out.with_suffix(f".{name}.partial.json")
        cmd = [sys.executable, __file__, "--child", name, "--child-out", str(tmp), "--budget-s", f"{share:.1f}"]
        cmd += ["--seed", str(args.seed + i)]
        t1 = time.monotonic()
        try:
            proc = subprocess.run(
                cmd, timeout=share + 5.0, capture_output=True, text=True, env=os.environ.copy(), check=False
            )
            rc: int | str = proc.returncode
            tail = (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired as exc:
            rc, tail = "timeout", str(exc.stderr or "")[-2000:]
        rec: dict[str, Any] = {"class": name, "status": "no result", "returncode": rc}
        if tmp.exists():
            rec = {**json.loads(tmp.read_text()), "returncode": rc}
            tmp.unlink()
        if rc == "timeout" and rec.get("status") == "running":
            rec["status"] = "timeout"  # one trial (or a kernel compile) outlasted the class's share
        elif rc not in (0, "timeout") and rec.get("status") not in ("found", "error"):
            rec["status"] = "crashed"  # the process died (a fault in FlashInfer is a finding of this class)
        if rc != 0:
            rec["output_tail"] = tail
        repro = (rec.get("reproducer") or {}).pop("flashcheck_repro", None)
        if repro is not None:  # a reproducer `flashcheck replay` runs, next to the raw JSON
            path = out.with_name(f"{out.stem}-{name}.repro.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(repro, indent=1) + "\n")
            rec["repro_file"] = path.name  # beside the raw JSON, wherever that is copied to
        rec["wall_s"] = round(time.monotonic() - t1, 1)
        rec["share_s"] = round(share, 1)
        rec["describes"] = CLASSES[name][1]
        results.append(rec)
        print(f"{name}: {rec['status']} after {rec.get('trials', 0)} trials, {rec['wall_s']}s", flush=True)
    doc = {
        "kind": "defect_hunt",
        "command": " ".join(["python3", *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "budget_s": args.budget_s,
        "seed": args.seed,
        "elapsed_s": round(time.monotonic() - t0, 1),
        **versions,
        "classes": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
