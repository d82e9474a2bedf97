"""Where a driver step spends its wall time: milliseconds per step in each phase of `Driver.submit`, per
detection-layer setting, in one run over the same generated steps.

The phases do not nest (a phase called inside another counts as the outer one's time; their sum and "rest of the
step" make up the step); a phase that reads a device result
includes the wait for the device work queued before it (a region's synchronize waits for everything queued, the
settling of a step for its arena scan and output screens), so the table shows where the host stands still as well
as where it works. Steps run as sessions run them: each is submitted, and the one before settles once its host
preparation is done (`Driver.submit`).
Timing wrappers around the driver's methods add about a microsecond per call.

    python benchmarks/driver_phases.py --target decode-tc --steps 600 --out reports/raw/driver_phases-0.7.2.json
    # default layers off,cheap,all,off: the second 'off' shows the process's drift over the run
    python benchmarks/driver_phases.py --target cpu-reference --steps 100 --layers cheap      # anywhere
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# (owner, method, label): every top-level phase of a step; they never call one another
_DRIVER_PHASES = (
    ("spec_for", "batch spec"),
    ("_validate", "capacity check"),
    ("layout_for", "paged layout (host)"),
    ("queries", "query rows"),
    ("_reference", "fp32 reference (host work and launch)"),
    ("_sync", "synchronize at each region's end"),
    ("_host", "host copies of outputs"),
    ("_merge_detector_findings", "drain and merge detector findings"),
    ("_compare_later", "output screens vs reference (launch)"),
)
_TARGET_PHASES = (
    ("plan", "target plan (eager)"),
    ("run", "target run (eager)"),
    ("capture", "target capture"),
    ("prepare_replay", "target prepare_replay (metadata and plan)"),
    ("graph_metadata", "target graph metadata"),
    ("plan_info", "target plan info"),
    ("replay", "target replay"),
)
_ARENA_PHASES = (
    ("arm", "arena arm"),
    ("probe", "arena scan (launch)"),
    ("account", "arena scan (accounting)"),
    ("scan", "arena scan again after an eager check"),
)
_PROPERTY_LABELS = {
    "AFTER_PLAN": "properties after plan (CSR of the plan inputs)",
    "BEFORE_REPLAY": "properties before replay (graph-bound CSR, plan info)",
    "ON_OUTPUT": "properties on each output (shape, finiteness)",
    "COMPARE": "comparisons whose screen was set (host copies)",
}


class _Clock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self.depth = 0

    def wrap(self, owner: Any, name: str, label: str) -> Callable[[], None]:
        """Time `owner.name` under `label`; returns the undo."""
        original = owner.__dict__[name]

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            return self.time(label, original, *args, **kwargs)

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)

    def time(self, label: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, its time added to `label`, unless a timed phase is running already (a target
        whose capture prepares a replay): phases never count twice."""
        if self.depth:
            return fn(*args, **kwargs)
        self.depth += 1
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.depth -= 1
            self.seconds[label] += time.perf_counter() - t0
            self.calls[label] += 1


@contextlib.contextmanager
def _timed(clock: _Clock, driver_cls: Any, target_cls: Any, arena_cls: Any) -> Iterator[None]:
    from flashcheck.deferred import Transfer

    undo: list[Callable[[], None]] = []
    for cls, names in ((driver_cls, _DRIVER_PHASES), (target_cls, _TARGET_PHASES), (arena_cls, _ARENA_PHASES)):
        for name, label in names:
            owner = next((c for c in cls.__mro__ if name in c.__dict__), None)
            if owner is not None:
                undo.append(clock.wrap(owner, name, label))
    undo.append(clock.wrap(Transfer, "read", "settle: wait for the step's one transfer (scan and screens)"))
    original = next(c for c in driver_cls.__mro__ if "_properties" in c.__dict__).__dict__["_properties"]

    def properties(self: Any, phase: Any, observation: object) -> Any:
        label = _PROPERTY_LABELS.get(phase.name, f"properties {phase.name}")
        return clock.time(label, original, self, phase, observation)

    driver_cls._properties = properties
    undo.append(lambda: setattr(driver_cls, "_properties", original))
    try:
        yield
    finally:
        for u in reversed(undo):
            u()


def measure(target: str, device: str, layers: str, steps: int, seed: int) -> dict[str, Any]:
    from flashcheck.driver import Driver
    from flashcheck.fuzzing.scenarios import random_steps
    from flashcheck.runtime.arena import Arena
    from flashcheck.session import open_session

    clock = _Clock()
    with open_session(target, device=device, layers=layers, seed=seed) as drv:  # type: ignore[arg-type]
        n_warm = len(drv.cap.buckets) + 20  # captures and first-use JIT, not timed
        plan = random_steps(drv.cap, steps + n_warm, seed)
        for i in range(n_warm):
            drv.execute(plan[i], i)
        ops = collections.Counter(s.op for s in plan[n_warm:])
        with _timed(clock, Driver, type(drv.target), Arena):
            t0 = time.perf_counter()
            for i in range(n_warm, len(plan)):  # each step settles while the next is prepared, as sessions run
                drv.submit(plan[i], i)
            drv.finish()
            wall = time.perf_counter() - t0
    phases = {
        label: {"ms_per_step": clock.seconds[label] / steps * 1e3, "calls": clock.calls[label]}
        for label in sorted(clock.seconds, key=lambda k: -clock.seconds[k])
    }
    rest = wall - sum(clock.seconds.values())
    phases["rest of the step (watchdog, regions, bookkeeping)"] = {"ms_per_step": rest / steps * 1e3, "calls": steps}
    return {
        "steps": steps,
        "ops": dict(ops),
        "wall_s": wall,
        "steps_per_s": steps / wall,
        "ms_per_step": wall / steps * 1e3,
        "phases": phases,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="decode-tc")
    p.add_argument("--device", default=None, help="cuda or cpu (default: CUDA when available)")
    p.add_argument(
        "--layers", default="off,cheap,all,off", help="comma-separated: off, cheap, all (a setting may repeat)"
    )
    p.add_argument("--steps", type=int, default=600, help="timed steps per layer setting")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON result here")
    a = p.parse_args(argv)
    from flashcheck.rundir import environment
    from flashcheck.session import default_device

    device = a.device or default_device()
    result: dict[str, Any] = {
        "benchmark": "driver_phases",
        "command": " ".join(["benchmarks/driver_phases.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "versions": environment(probe=True),
        "config": {"target": a.target, "device": device, "steps": a.steps, "seed": a.seed},
        "layers": {},
    }
    settings = a.layers.split(",")
    for n, layers in enumerate(settings):
        # a setting named twice (off,cheap,all,off) shows how much the process's own drift moves the figures
        key = layers if layers not in settings[:n] else f"{layers} (again, run {n + 1})"
        r = result["layers"][key] = measure(a.target, device, layers, a.steps, a.seed)
        print(f"== layers {key}: {r['steps_per_s']:.1f} steps/s, {r['ms_per_step']:.3f} ms per step, ops {r['ops']}")
        for label, ph in r["phases"].items():
            print(f"   {ph['ms_per_step']:8.3f} ms  {label} (x{ph['calls']})")
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
