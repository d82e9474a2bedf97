"""Where a driver step spends its time: cProfile of generated steps on one target, per detection-layer setting.

    python benchmarks/profile_driver.py --target decode-tc --steps 300 --layers cheap,all      # on a GPU node
    python benchmarks/profile_driver.py --target cpu-reference --steps 200 --layers cheap      # anywhere
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time


def profile(target: str, device: str, layers: str, steps: int, seed: int, top: int) -> str:
    from flashcheck.fuzz.scenarios import random_steps
    from flashcheck.session import open_session

    with open_session(target, device=device, layers=layers, seed=seed) as drv:  # type: ignore[arg-type]
        plan = random_steps(drv.cap, steps + len(drv.cap.buckets) + 20, seed)
        n_warm = len(drv.cap.buckets) + 20  # captures and first-use JIT, not profiled
        for i in range(n_warm):
            drv.execute(plan[i], i)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for i in range(n_warm, len(plan)):
            drv.execute(plan[i], i)
        prof.disable()
        dt = time.perf_counter() - t0
    buf = io.StringIO()
    buf.write(f"== {target} layers={layers}: {steps} steps in {dt:.2f}s = {steps / dt:.1f} steps/s (profiled)\n")
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
    return buf.getvalue()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="decode-tc")
    p.add_argument("--device", default=None)
    p.add_argument("--layers", default="cheap,all", help="comma-separated: off, cheap, all")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    from flashcheck.session import default_device

    device = a.device or default_device()
    for layers in a.layers.split(","):
        print(profile(a.target, device, layers, a.steps, a.seed, a.top), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
