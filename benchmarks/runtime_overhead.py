"""Overhead of the runtime checker on a replay loop: checker off vs cheap layers vs all layers, in one run.

Each step does what an engine's decode step does around a CUDA graph: host-side prepare (fill a pinned host buffer,
one non_blocking H2D copy into the graph's static input) and ``graph.replay()``; "off" is that loop with no checker
and no region. Each checker setting runs its rounds interleaved with rounds of "off", so that clock drift hits them
alike ("cheap" first, "all" last: a CUPTI client can leave a cost in the process once it has run); the table shows
the median µs per step and the ratio to the "off" rounds beside it.

That wall-clock loop is bounded by the host or by the device, whichever is slower per step, and this one sits near
the crossing (a 256 KB copy and a small graph): host work the checker adds is hidden while the device is the
bound, so the wall ratio moves with the device's clocks from one machine start to the next. Each round therefore
also times the host alone: the same steps with a synchronize every 32 steps outside the timed spans (the launch
queue never fills, so no launch waits for the device), which gives the checker's added host µs per step and the host
ratio, figures that do not depend on the device.

    python benchmarks/runtime_overhead.py --out reports/raw/runtime_overhead.json [--steps 3000 --rounds 15]

Needs a CUDA device; on a machine without one it exits with status 3 and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODES = ("off", "cheap", "all", "all-python")
# "all-python": the layers of "all" with the cupti layer on cupti-python's Python callbacks instead of its C filter
_CUPTI_FILTER_OFF = {"all-python": "0"}


@contextlib.contextmanager
def _checker(mode: str) -> Any:
    """A checker of `mode`, entered (the cupti layer picks its callbacks as it opens)."""
    from flashcheck.runtime import Checker

    old = os.environ.get("FLASHCHECK_CUPTI_FILTER")
    if mode in _CUPTI_FILTER_OFF:
        os.environ["FLASHCHECK_CUPTI_FILTER"] = _CUPTI_FILTER_OFF[mode]
    try:
        with Checker(layers="all" if mode == "all-python" else mode) as chk:  # type: ignore[arg-type]
            yield chk
    finally:
        if old is None:
            os.environ.pop("FLASHCHECK_CUPTI_FILTER", None)
        else:
            os.environ["FLASHCHECK_CUPTI_FILTER"] = old


def _layers(chk: Any) -> list[str]:
    """The checker's active layers, the cupti layer with how it calls back."""
    note = getattr(chk.hook("cupti"), "backend_note", None)
    return [f"{n} ({note})" if n == "cupti" and note else n for n in chk.active_layers]


def _versions(torch: Any) -> dict[str, Any]:
    from flashcheck.rundir import environment

    return {**environment(probe=True), "capability": list(torch.cuda.get_device_capability())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path of the JSON result")
    ap.add_argument("--steps", type=int, default=3000, help="replay steps per mode and round")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds (median reported)")
    ap.add_argument("--warmup", type=int, default=200, help="untimed steps per mode and round")
    ap.add_argument("--batch", type=int, default=64, help="rows of the graph's input")
    ap.add_argument("--hidden", type=int, default=1024, help="columns of the graph's input")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("runtime_overhead: torch is not installed; nothing to measure", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print(
            "runtime_overhead: no CUDA device here. This benchmark times CUDA graph replays with the checker off, "
            "cheap and all; run it on a GPU node.",
            file=sys.stderr,
        )
        return 3

    dev = torch.device("cuda")
    static_in = torch.zeros(args.batch, args.hidden, device=dev)
    weight = torch.randn(args.hidden, args.hidden, device=dev) / args.hidden**0.5
    host_in = torch.zeros(args.batch, args.hidden).pin_memory()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            static_out = torch.relu(static_in @ weight)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.relu(static_in @ weight)
    torch.cuda.synchronize()

    def prepare(step: int) -> None:
        host_in[0, 0] = float(step)  # host-side metadata update
        static_in.copy_(host_in, non_blocking=True)

    def loop(n: int, region: Callable[..., contextlib.AbstractContextManager[None]]) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for step in range(n):
            with region("prepare_replay", step=step):
                prepare(step)
            with region("replay", step=step):
                graph.replay()
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / n / 1e3

    def bare_loop(n: int) -> float:
        """The baseline: the same steps with no checker and no region at all (an engine without flashcheck)."""
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for step in range(n):
            prepare(step)
            graph.replay()
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / n / 1e3

    def host_loop(n: int, region: Callable[..., contextlib.AbstractContextManager[None]] | None) -> float:
        """Host µs per step: only the spans between synchronizes are timed, 32 steps each."""
        total = 0
        for start in range(0, n, 32):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            for step in range(start, min(n, start + 32)):
                if region is None:
                    prepare(step)
                    graph.replay()
                    continue
                with region("prepare_replay", step=step):
                    prepare(step)
                with region("replay", step=step):
                    graph.replay()
            total += time.perf_counter_ns() - t0
        torch.cuda.synchronize()
        return total / n / 1e3

    host: dict[str, list[float]] = {m: [] for m in MODES}
    host_base: dict[str, list[float]] = {m: [] for m in MODES}
    per_mode: dict[str, list[float]] = {m: [] for m in MODES}
    base_rounds: dict[str, list[float]] = {m: [] for m in MODES}  # the "off" round beside each round of a mode
    drain_ms: dict[str, list[float]] = {m: [] for m in MODES}
    findings: dict[str, int] = dict.fromkeys(MODES, 0)
    layers: dict[str, list[str]] = {}
    # One phase per checker setting, each interleaving its rounds with rounds of "off": the "all" settings run last
    # because a CUPTI client, once it has run, can leave a cost in the process that would be charged to "cheap".
    for mode in MODES[1:]:
        for _ in range(args.rounds):
            bare_loop(args.warmup)
            off = bare_loop(args.steps)
            base_rounds[mode].append(off)
            off_host = host_loop(args.steps, None)
            host_base[mode].append(off_host)
            if mode == "cheap":
                per_mode["off"].append(off)
                base_rounds["off"].append(off)
                drain_ms["off"].append(0.0)
                host["off"].append(off_host)
                host_base["off"].append(off_host)
            with _checker(mode) as chk:
                layers[mode] = _layers(chk)
                loop(args.warmup, chk.region)
                findings[mode] += len(chk.drain_findings())
                per_mode[mode].append(loop(args.steps, chk.region))
                host[mode].append(host_loop(args.steps, chk.region))
                t0 = time.perf_counter_ns()
                findings[mode] += len(chk.drain_findings())
                drain_ms[mode].append((time.perf_counter_ns() - t0) / 1e6)
    assert float(static_out.sum()) == float(static_out.sum())  # keep the graph's output alive

    # each round's ratio to the "off" round beside it: clock and load drift between rounds cancels
    paired = {m: statistics.median(v / o for v, o in zip(per_mode[m], base_rounds[m], strict=True)) for m in MODES}
    base_of = {m: statistics.median(base_rounds[m]) for m in MODES}
    host_added = {m: statistics.median(v - o for v, o in zip(host[m], host_base[m], strict=True)) for m in MODES}
    result: dict[str, Any] = {
        "benchmark": "runtime_overhead",
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "versions": _versions(torch),
        "config": {k: getattr(args, k) for k in ("steps", "rounds", "warmup", "batch", "hidden")},
        "modes": {},
        "note": (
            "'off' is the same loop with no checker and no region (an engine without flashcheck), run before each "
            "round of a checker setting; 'all-python' is 'all' with the cupti layer on cupti-python's Python "
            "callbacks instead of its C filter (FLASHCHECK_CUPTI_FILTER=0); 'cheap' runs its rounds first and the "
            "'all' settings after it, since a CUPTI client "
            "(the cupti layer in 'all') can leave a cost in the process once it has run; gpu-trace activation "
            "cannot be undone, so "
            "'off' rounds after the first run with the trace active and no callbacks registered; each ratio is "
            "against the 'off' rounds beside that setting, 'paired' the median of the per-round ratios; 'host' "
            "figures time only the host (a synchronize every 32 steps, outside the timed spans), 'host_added_us' "
            "the median per-round difference to the 'off' host round beside it"
        ),
    }
    print(
        f"{'mode':<10} {'us/step':>10} {'ratio':>7} {'paired':>7} {'host us':>8} {'+host':>6} {'drain ms':>9} "
        f"{'findings':>9}  layers"
    )
    for mode in MODES:
        med = statistics.median(per_mode[mode])
        result["modes"][mode] = {
            "us_per_step_median": med,
            "us_per_step_rounds": per_mode[mode],
            "ratio_to_off": med / base_of[mode],
            "off_us_per_step_rounds": base_rounds[mode],
            "ratio_to_off_paired": paired[mode],
            "drain_ms_median": statistics.median(drain_ms[mode]),
            "findings": findings[mode],
            "layers": layers.get(mode, []),
            "host_us_per_step_median": statistics.median(host[mode]),
            "host_us_per_step_rounds": host[mode],
            "off_host_us_per_step_rounds": host_base[mode],
            "host_added_us_paired": host_added[mode],
            "host_ratio_paired": statistics.median(v / o for v, o in zip(host[mode], host_base[mode], strict=True)),
        }
        print(
            f"{mode:<10} {med:>10.2f} {med / base_of[mode]:>7.2f} {paired[mode]:>7.2f} "
            f"{statistics.median(host[mode]):>8.2f} {host_added[mode]:>6.2f} "
            f"{statistics.median(drain_ms[mode]):>9.2f} "
            f"{findings[mode]:>9}  {', '.join(layers.get(mode, [])) or '-'}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
