"""How long an isolated worker takes to start and to restart (until its session is open and it answers), forked
from the zygote (``flashcheck._spawn``, the default) beside a plain ``python -m`` worker (``FLASHCHECK_ZYGOTE=0``),
alternating in one run. A fuzz run or a campaign restarts a worker after every fault and hang, so a restart is paid
once per fault. The first start of each setting (the zygote's own start-up, and the kernels' first compile on a GPU)
is reported apart from the restarts after it.

    python benchmarks/worker_start.py --target decode-tc --device cuda --out $OUT/worker_start-0.6.13.json   # GPU
    python benchmarks/worker_start.py --target cpu-reference --device cpu                                  # anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def starts(target: str, device: str | None, layers: str, restarts: int, zygote: str) -> dict[str, Any]:
    """Start a worker, run one step in it, then stop and start it `restarts` times; seconds to each start."""
    from flashcheck import _spawn
    from flashcheck.fuzzing.scenarios import random_steps
    from flashcheck.isolation import IsolatedDriver

    os.environ["FLASHCHECK_ZYGOTE"] = zygote
    seconds: list[float] = []
    forked = []
    with IsolatedDriver(target, device=device, layers=layers) as drv:
        step = random_steps(drv.cap, 1, 0)[0]
        for _ in range(restarts + 1):
            t0 = time.perf_counter()
            assert drv._ensure_started() is None  # the target's setup raised: nothing to time
            seconds.append(time.perf_counter() - t0)
            forked.append(isinstance(drv._proc, _spawn.Worker))
            result = drv.execute(step, 0)
            assert not result.findings and result.rejected is None, result
            drv._stop_worker()
    return {
        "first_s": round(seconds[0], 3),
        "restart_s": [round(s, 3) for s in seconds[1:]],
        "restart_median_s": round(statistics.median(seconds[1:]), 3),
        "forked": all(forked),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="cpu-reference")
    p.add_argument("--device", default=None)
    p.add_argument("--layers", default="all")
    p.add_argument("--restarts", type=int, default=5)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from flashcheck.rundir import environment

    doc: dict[str, Any] = {
        "command": " ".join(["benchmarks/worker_start.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "environment": environment(probe=True),
        "settings": {},
    }
    # the zygote first: a GPU's first start compiles the kernels, which favours the plain worker after it
    for name, value in (("forked from the zygote", "1"), ("plain python -m (FLASHCHECK_ZYGOTE=0)", "0")):
        doc["settings"][name] = starts(a.target, a.device, a.layers, a.restarts, value)
        print(name, doc["settings"][name], file=sys.stderr)
    if a.out:
        Path(a.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
