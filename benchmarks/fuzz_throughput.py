"""Fuzz throughput: scenario steps per second through the flashcheck Driver (all properties on), side by side in one
run with a plain Hypothesis ``@given`` loop over the same target (the baseline: per-element list strategies, plan and
run the wrapper eagerly, compare with a reference). About 112 examples/s was measured for such a loop on an H100.
The baseline runs first and last; ratios are against the faster of its two runs.

Within each layer setting the flashcheck modes run in rounds, one after another in each round (``--rounds``, each
mode ``--seconds`` a round), so that a slow spell of a shared host falls on every mode alike; a mode's figure is the
median of its rounds, shown beside its slowest and fastest round and its rate over all of them.

    python benchmarks/fuzz_throughput.py --target decode-tc --out reports/raw/fuzz_throughput.json      # H100
    python benchmarks/fuzz_throughput.py --target cpu-reference --seconds 5                               # anywhere
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def bench_driver(target: str, device: str, layers: str, seconds: float, seed: int) -> dict[str, Any]:
    """Bulk-numpy scenarios (captures, replays below buckets, eager steps) through the Driver: every property. Each
    step is submitted before the previous one settles (`Driver.submit`), as the session and worker loops run them."""
    from flashcheck.fuzzing.scenarios import random_steps
    from flashcheck.session import open_session

    with open_session(target, device=device, layers=layers, seed=seed) as drv:  # type: ignore[arg-type]
        # steps come in chunks, as a campaign worker gets them: 100k live Step objects would slow every full GC
        steps = random_steps(drv.cap, _CHUNK, seed)
        n_warm = len(drv.cap.buckets) + 20  # captures + JIT of every kernel variant before timing
        for i in range(n_warm):
            drv.execute(steps[i], i)
        _sync(device)
        t0, i, findings, known, ops = time.perf_counter(), n_warm, 0, 0, {"eager": 0, "capture": 0, "replay": 0}
        bs: list[int] = []
        kv: list[int] = []
        windows: list[float] = []
        t_win = t0
        while time.perf_counter() - t0 < seconds:
            if i % _CHUNK == 0:
                steps = random_steps(drv.cap, _CHUNK, seed + i, capture_first=False)
            step = steps[i % _CHUNK]
            for _, r in drv.submit(step, i):  # the step before settles while this one is prepared
                findings, known = _count(r, drv.target.name, findings, known)
            bs.append(len(step.kv_lens))
            kv.append(sum(step.kv_lens))
            ops[step.op] += 1
            i += 1
            if (i - n_warm) % 250 == 0:  # steps/s per window of 250 steps: shows drift within the timed run
                now = time.perf_counter()
                windows.append(round(250 / (now - t_win), 1))
                t_win = now
        for _, r in drv.finish():
            findings, known = _count(r, drv.target.name, findings, known)
        _sync(device)
        dt = time.perf_counter() - t0
    n = i - n_warm
    return {
        "mode": "driver (bulk numpy scenarios)",
        "steps": n,
        "seconds": dt,
        "per_second": n / dt,
        "findings": findings,
        "known": known,  # documented upstream behaviours (flashcheck.known), as the state machine counts them apart
        "ops": ops,
        "windows_steps_per_s": windows,
        **_means(bs, kv),
    }


_CHUNK = 1000


def _count(r: Any, target: str, findings: int, known: int) -> tuple[int, int]:
    """The running counts of findings and of documented upstream behaviours (`flashcheck.known`), with `r`'s."""
    from flashcheck.known import split_known

    unexpected, documented = split_known(r.findings, target)
    return findings + len(unexpected), known + len(documented)


def _means(bs: list[int], kv: list[int]) -> dict[str, float]:
    """Mean batch size and KV tokens per step: the modes draw different shapes, so compare work, not only counts."""
    return {"mean_batch": float(np.mean(bs)) if bs else 0.0, "mean_kv_tokens": float(np.mean(kv)) if kv else 0.0}


def bench_state_machine(
    target: str, device: str, layers: str, seconds: float, seed: int, *, pipeline: bool = True
) -> dict[str, Any]:
    """The Hypothesis replay state machine (shrinking-capable), counting executed steps. `pipeline`: the isolated
    worker runs a step while the parent draws the next (`fuzz_target`'s default), or one step at a time. The session
    (the isolated worker) stays open for the next round: `close_sessions` ends it."""
    from flashcheck.fuzzing.stateful import FuzzFailure, fuzz_target

    count = [0]
    bs: list[int] = []
    kv: list[int] = []

    def on_step(step: Any, result: Any) -> None:
        count[0] += 1
        bs.append(len(step.kv_lens))
        kv.append(sum(step.kv_lens))

    fuzz_target(
        target,
        budget=3,
        seed=seed,
        profile="gpu" if device.startswith("cuda") else "ci",
        device=device,
        layers=layers,
        database=None,
        check=on_step,
        pipeline=pipeline,
    )  # warm-up (session + JIT), not timed
    count[0] = 0
    bs.clear()
    kv.clear()
    t0 = time.perf_counter()
    findings = 0
    try:
        fuzz_target(
            target,
            budget=f"{seconds}s",
            seed=seed,
            profile="gpu" if device.startswith("cuda") else "ci",
            device=device,
            layers=layers,
            database=None,
            check=on_step,
            pipeline=pipeline,
        )
    except FuzzFailure as exc:
        findings = len(exc.findings)
    dt = time.perf_counter() - t0
    return {
        "mode": "Hypothesis state machine" + ("" if pipeline else " (one step at a time)"),
        "steps": count[0],
        "seconds": dt,
        "per_second": count[0] / dt,
        "findings": findings,
        **_means(bs, kv),
    }


def bench_given_baseline(target: str, device: str, seconds: float, seed: int) -> dict[str, Any]:
    """The baseline: ``@given`` draws a batch element by element, plans and runs eagerly, compares with a reference."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from flashcheck.layout import build_paged_layout
    from flashcheck.properties.equivalence import tolerance_for
    from flashcheck.reference.torch_ref import paged_attention_torch
    from flashcheck.session import open_session

    with open_session(target, device=device, layers="off", seed=seed) as drv:  # type: ignore[arg-type]
        cap, tgt = drv.cap, drv.target
        page = cap.template.page_size
        max_kv = max(8, min(cap.max_kv_len, (cap.max_pages - 2) * page // cap.max_batch_size))
        tol = tolerance_for(cap.template.q_dtype, cap.template.kv_dtype)
        done = [0]
        mismatches = [0]
        bs: list[int] = []
        kv: list[int] = []
        deadline = [0.0]

        @settings(
            max_examples=10**9, deadline=None, database=None, derandomize=False, suppress_health_check=list(HealthCheck)
        )
        @given(st.lists(st.integers(1, max_kv), min_size=1, max_size=cap.max_batch_size), st.integers(0, 2**31 - 1))
        def loop(kv_lens: list[int], s: int) -> None:
            if time.perf_counter() > deadline[0]:
                return
            spec = cap.template.with_lengths([1] * len(kv_lens), kv_lens)
            layout = build_paged_layout(spec, num_pages=cap.max_pages, allocator="shuffled", seed=s)
            q = drv.queries(spec, s)
            tgt.plan(layout)
            out = tgt.run(q)
            ref = paged_attention_torch(q, drv.k_cache, drv.v_cache, layout)
            got = out.float()
            if not bool((got - ref).abs().le(tol.atol + tol.rtol * ref.abs()).all()):
                mismatches[0] += 1
            done[0] += 1
            bs.append(len(kv_lens))
            kv.append(sum(kv_lens))

        deadline[0] = time.perf_counter() + min(5.0, seconds)  # warm-up (JIT), not timed
        _run_until(loop, deadline)
        done[0] = 0
        bs.clear()
        kv.clear()
        _sync(device)
        t0 = time.perf_counter()
        deadline[0] = t0 + seconds
        _run_until(loop, deadline)
        _sync(device)
        dt = time.perf_counter() - t0
    return {
        "mode": "plain @given loop (baseline)",
        "steps": done[0],
        "seconds": dt,
        "per_second": done[0] / dt,
        "findings": mismatches[0],
        **_means(bs, kv),
    }


def _over_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's rounds as one row: ``per_second`` is the median of the rounds' rates (``rounds``), beside the rate
    over every round's steps and time (``overall_per_second``); means of batch and KV tokens are over every step."""
    steps = sum(int(r["steps"]) for r in runs)
    seconds = sum(float(r["seconds"]) for r in runs)
    rates = [float(r["per_second"]) for r in runs]

    def weighted(key: str) -> float:
        return sum(float(r.get(key, 0.0)) * int(r["steps"]) for r in runs) / steps if steps else 0.0

    return {
        "mode": runs[0]["mode"],
        "steps": steps,
        "seconds": seconds,
        "per_second": float(np.median(rates)),
        "rounds": rates,
        "overall_per_second": steps / seconds if seconds > 0 else 0.0,
        "findings": sum(int(r["findings"]) for r in runs),
        "mean_batch": weighted("mean_batch"),
        "mean_kv_tokens": weighted("mean_kv_tokens"),
        "runs": runs,
    }


def _baseline_row(args: argparse.Namespace, device: str, when: str) -> dict[str, Any]:
    row = bench_given_baseline(args.target, device, args.seconds, args.seed)
    row["mode"] = f"{row['mode']}, run {when}"
    print(json.dumps(row, default=str), flush=True)
    return row


class _Stop(Exception):
    pass


def _run_until(loop: Any, deadline: list[float]) -> None:
    """Run the @given loop until the deadline (it has no time budget of its own: stop it from inside)."""
    inner = loop.hypothesis.inner_test

    def wrapped(*a: Any, **k: Any) -> None:
        if time.perf_counter() > deadline[0]:
            raise _Stop
        inner(*a, **k)

    loop.hypothesis.inner_test = wrapped
    try:
        loop()
    except _Stop:
        pass
    except BaseException as exc:  # Hypothesis wraps the stop in its own reporting
        if "_Stop" not in repr(exc) and not isinstance(getattr(exc, "__cause__", None), _Stop):
            raise
    finally:
        loop.hypothesis.inner_test = inner


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="decode-tc")
    p.add_argument("--device", default=None, help="cuda or cpu (default: CUDA when available)")
    p.add_argument(
        "--layers",
        default="cheap,all",
        help="comma-separated detection layers to run the flashcheck modes "
        "under (off, cheap, all); every property is checked under each",
    )
    p.add_argument(
        "--state-machine",
        default="pipelined,serial",
        help="comma-separated state machine modes: pipelined (the default of fuzz runs: the isolated worker runs a "
        "step while Hypothesis draws the next), serial (one step at a time)",
    )
    p.add_argument(
        "--seconds", type=float, default=8.0, help="timed seconds per flashcheck mode and round, and per baseline run"
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of the flashcheck modes per layer setting (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON result here")
    args = p.parse_args(argv)

    import torch

    from flashcheck.fuzzing.stateful import close_sessions
    from flashcheck.rundir import environment
    from flashcheck.session import default_device

    device = args.device or default_device()
    if device == "cpu":
        torch.set_num_threads(1)  # tiny CPU ops: thread-pool contention dominates otherwise
    print(
        f"fuzz throughput: target {args.target}, device {device}, layers {args.layers}, {args.seconds:g}s per "
        f"mode, seed {args.seed}",
        flush=True,
    )
    # the baseline runs first and last: the faster of the two is the reference (drift between them is visible)
    rows = [_baseline_row(args, device, "first")]
    if args.rounds < 1:
        p.error(f"--rounds: {args.rounds} is not a positive number of rounds")
    for layers in args.layers.split(","):
        if layers not in ("off", "cheap", "all"):
            p.error(f"--layers: {layers!r} is not one of off, cheap, all")
        benches: list[Any] = [bench_driver]
        for m in args.state_machine.split(","):
            if m not in ("pipelined", "serial"):
                p.error(f"--state-machine: {m!r} is not one of pipelined, serial")
            benches.append(functools.partial(bench_state_machine, pipeline=m == "pipelined"))
        by_mode: list[list[dict[str, Any]]] = [[] for _ in benches]
        for rnd in range(args.rounds):  # each round runs every mode: a slow spell of the host falls on all alike
            for runs, bench in zip(by_mode, benches, strict=True):
                row = bench(args.target, device, layers, args.seconds, args.seed + rnd)
                row["round"] = rnd
                runs.append(row)
                print(json.dumps(row, default=str), flush=True)
        close_sessions()
        for runs in by_mode:
            row = _over_rounds(runs)
            row["mode"] = f"{row['mode']}, layers {layers}"
            row["layers"] = layers
            rows.append(row)
    rows.append(_baseline_row(args, device, "last"))
    base = max(float(r["per_second"]) for r in rows if r["mode"].startswith("plain @given"))
    print(
        f"\n{'mode':64} {'steps':>8} {'seconds':>8} {'steps/s':>9} {'rounds':>15} {'vs @given':>9} {'findings':>8} "
        f"{'mean bs':>8} {'mean kv':>9}"
    )
    for r in rows:
        r["vs_given"] = r["per_second"] / base if base > 0 else None
        ratio = f"{r['vs_given']:.2f}x" if r["vs_given"] is not None else "n/a"
        spread = f"{min(r['rounds']):.0f}-{max(r['rounds']):.0f}" if r.get("rounds") else "-"
        print(
            f"{r['mode']:64} {r['steps']:>8} {r['seconds']:>8.1f} {r['per_second']:>9.1f} {spread:>15} {ratio:>9} "
            f"{r['findings']:>8} {r.get('mean_batch', 0):>8.1f} {r.get('mean_kv_tokens', 0):>9.0f}"
        )
    doc = {
        "benchmark": "fuzz_throughput",
        "date": time.strftime("%Y-%m-%d"),
        "target": args.target,
        "device": device,
        "layers": args.layers,
        "rounds": args.rounds,
        "seconds_per_mode": args.seconds,
        "seed": args.seed,
        "results": rows,
        "environment": environment(),
        "host": platform.node(),
        "argv": sys.argv,
        "numpy": np.__version__,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
