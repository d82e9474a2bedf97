"""Where a driver step spends its time: cProfile of generated steps on one target, per detection-layer setting.

    python benchmarks/profile_driver.py --target decode-tc --steps 300 --layers cheap,all      # on a GPU node
    python benchmarks/profile_driver.py --target cpu-reference --steps 200 --layers cheap      # anywhere
    python benchmarks/profile_driver.py --target decode-tc --steps 100 --layers cheap --kernels  # + device time
    python benchmarks/profile_driver.py --target decode-tc --mode state-machine --seconds 10 --layers cheap
    python benchmarks/profile_driver.py --target decode-tc --layers all --dump out/   # + out/driver-all.prof

``--dump DIR`` also writes each profile's raw statistics (``pstats`` format: callers and callees, for
``python -m pstats``) to ``DIR/<mode>-<layers>.prof``.

With ``--kernels`` a second pass of the same steps runs under ``torch.profiler`` and prints the operators and
kernels by device time (layers ``cheap`` or ``off`` only: ``all`` owns the process's CUPTI session).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import time
from pathlib import Path


def _report(prof: cProfile.Profile, head: str, top: int, dump: Path | None) -> str:
    """The profile's top functions by cumulative and by own time, after `head`; its raw statistics to `dump`."""
    if dump is not None:
        dump.parent.mkdir(parents=True, exist_ok=True)
        prof.dump_stats(dump)
    buf = io.StringIO()
    buf.write(head)
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
    return buf.getvalue()


def profile(
    target: str,
    device: str,
    layers: str,
    steps: int,
    seed: int,
    top: int,
    kernels: bool = False,
    dump: Path | None = None,
) -> str:
    from flashcheck.fuzzing.scenarios import random_steps
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
        table = _kernel_table(drv, plan, n_warm, top) if kernels else ""
    head = f"== {target} layers={layers}: {steps} steps in {dt:.2f}s = {steps / dt:.1f} steps/s (profiled)\n"
    return _report(prof, head, top, dump) + table


def profile_machine(
    target: str, device: str, layers: str, seconds: float, seed: int, top: int, dump: Path | None = None
) -> str:
    """cProfile of the Hypothesis replay state machine (what ``pytest -m fuzz`` runs) for `seconds`, after a
    warm-up round (session, JIT); counts executed steps."""
    from flashcheck.fuzzing.stateful import FuzzFailure, close_sessions, fuzz_target

    count = [0]

    def on_step(step: object, result: object) -> None:
        count[0] += 1

    kw = {
        "seed": seed,
        "profile": "gpu" if device.startswith("cuda") else "ci",
        "device": device,
        "layers": layers,
        "database": None,
        "check": on_step,
    }
    fuzz_target(target, budget=3, **kw)  # type: ignore[arg-type]
    count[0] = 0
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    with contextlib.suppress(FuzzFailure):  # a finding ends the run early; the profile stands
        fuzz_target(target, budget=f"{seconds}s", **kw)  # type: ignore[arg-type]
    prof.disable()
    dt = time.perf_counter() - t0
    close_sessions()
    head = (
        f"== {target} state machine layers={layers}: {count[0]} steps in {dt:.2f}s = "
        f"{count[0] / dt:.1f} steps/s (profiled)\n"
    )
    return _report(prof, head, top, dump)


def _kernel_table(drv: object, plan: list[object], n_warm: int, top: int) -> str:
    """The same steps again under torch.profiler: operators by self device time, and the device's busy share."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    execute = drv.execute  # type: ignore[attr-defined]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
        for i in range(n_warm, len(plan)):
            execute(plan[i], len(plan) + i)
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    ka = tp.key_averages()
    busy = sum(getattr(e, "self_device_time_total", 0.0) for e in ka) / 1e6
    head = (
        f"== device time: {busy:.3f}s busy of {wall:.3f}s wall under the profiler "
        f"({100 * busy / wall:.0f}%; kernels and copies, summed)\n"
    )
    return head + ka.table(sort_by="self_device_time_total", row_limit=top) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="decode-tc")
    p.add_argument("--device", default=None)
    p.add_argument("--layers", default="cheap,all", help="comma-separated: off, cheap, all")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--kernels", action="store_true", help="also profile device time with torch.profiler (CUDA)")
    p.add_argument(
        "--mode",
        choices=("driver", "state-machine"),
        default="driver",
        help="profile the driver over generated steps, or the Hypothesis state machine",
    )
    p.add_argument("--seconds", type=float, default=10.0, help="state-machine mode: profiled seconds")
    p.add_argument("--dump", type=Path, default=None, help="also write each raw profile to DIR/<mode>-<layers>.prof")
    a = p.parse_args()
    if a.kernels and "all" in a.layers.split(","):
        p.error("--kernels: the 'all' layers own the process's CUPTI session; use --layers cheap or off")
    from flashcheck.session import default_device

    device = a.device or default_device()
    for layers in a.layers.split(","):
        dump = a.dump / f"{a.mode}-{layers}.prof" if a.dump is not None else None
        if a.mode == "state-machine":
            print(profile_machine(a.target, device, layers, a.seconds, a.seed, a.top, dump), flush=True)
            continue
        print(profile(a.target, device, layers, a.steps, a.seed, a.top, a.kernels, dump), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
