"""Verdicts on faulty engine targets: every bug family is found (never skipped, never "environment"), in each mode.

Three modes, each bounded by its own time budget, over the faulty targets of ``tests/quality/faulty_engine_gpu.py``
(kernel faults from stale plans, unbound buffers, graph wrappers built or re-planned wrong, eager-path syncs, an
output-contract violation):

- ``driver``: each target in an isolated session (`flashcheck.isolation.IsolatedDriver`): steps and seconds to the
  first finding of an accepted check;
- ``campaign``: one ``flashcheck campaign`` over a faulting, a hanging, a raising and an eager-sync target and the
  clean built-in ``decode-tc``: findings per target, targets dropped, steps run, and each reproducer replayed in a
  fresh process (``flashcheck replay``, exit 1 = the same finding came back);
- ``campaign-plain``: the same campaign with every worker started as a plain ``python -m`` (``FLASHCHECK_ZYGOTE=0``)
  instead of forked from the zygote (`flashcheck._spawn`): the baseline of what faster restarts buy in one budget;
- ``plugin``: ``pytest -m fuzz`` through the plugin on one target per family: exit status and the checks reported;
- ``sanitizer``: the campaign's first kernel-fault reproducer replayed under ``compute-sanitizer --tool memcheck``
  (``flashcheck replay REPRO --sanitizer memcheck``): the kernel and the error it names.

    PYTHONPATH=src:tests/quality python benchmarks/verdicts.py --out $OUT/verdicts-0.6.13.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUALITY = ROOT / "tests" / "quality"
CAMPAIGN = ("NoReplanDecodeTC", "KernelNeverEnds", "ReplanWithRealBatch", "EagerCpuSync")
PLUGIN = ("NoReplanDecodeCuda", "ReplanWithRealBatch", "EagerScalarSync", "ExtraPaddedRow")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(QUALITY), env.get("PYTHONPATH", "")])
    return env


def driver_mode(
    steps: int, seed: int, step_timeout: float, deadline: float, only: set[str] | None = None
) -> list[dict[str, Any]]:
    from faulty_engine_gpu import FAULTY_ENGINE_TARGETS

    from flashcheck.fuzzing.scenarios import random_steps
    from flashcheck.isolation import IsolatedDriver
    from flashcheck.known import split_known

    out: list[dict[str, Any]] = []
    for name, (cls, accepted) in FAULTY_ENGINE_TARGETS.items():
        if only and name not in only:
            continue
        rec: dict[str, Any] = {"target": name, "class": cls.__name__, "accepted": list(accepted), "found": False}
        if time.monotonic() > deadline:
            rec["skipped"] = "time budget of the driver mode spent"
            out.append(rec)
            continue
        t0 = time.perf_counter()
        seen: dict[str, int] = {}
        try:
            with IsolatedDriver(
                f"faulty_engine_gpu:{cls.__name__}", device="cuda", layers="cheap", seed=seed, step_timeout=step_timeout
            ) as drv:
                plan = random_steps(drv.cap, steps, seed)
                t1 = time.perf_counter()
                for i, s in enumerate(plan):
                    r = drv.execute(s, i)
                    unexpected, known = split_known(r.findings, drv.target.name)
                    for f in unexpected:
                        seen[f.id] = seen.get(f.id, 0) + 1
                    for f, _ in known:
                        seen[f"known {f.id}"] = seen.get(f"known {f.id}", 0) + 1
                    hit = [f for f in unexpected if f.id in accepted]
                    if hit:
                        rec.update(
                            found=True,
                            check=hit[0].id,
                            steps_to_first=i + 1,
                            seconds_to_first=round(time.perf_counter() - t1, 2),
                            message=hit[0].message[:300],
                            location=str(hit[0].location),
                            restarts=drv.restarts,
                        )
                        break
                    if time.monotonic() > deadline:
                        rec["stopped"] = f"time budget spent after {i + 1} steps"
                        break
        except Exception as exc:  # recorded, never hidden: the report shows it as not found
            rec["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        rec["findings"] = seen
        rec["wall_s"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(rec), flush=True)
        out.append(rec)
    return out


def campaign_mode(work: Path, seconds: int, step_timeout: int, seed: int, plain: bool = False) -> dict[str, Any]:
    run = work / "campaign"
    targets = [f"faulty_engine_gpu:{c}" for c in CAMPAIGN] + ["decode-tc"]
    cmd = [sys.executable, "-m", "flashcheck", "campaign", "--target", ",".join(targets), "--time", f"{seconds}s"]
    cmd += ["--step-timeout", f"{step_timeout}s", "--chunk-steps", "20", "--layers", "cheap", "--seed", str(seed)]
    cmd += ["--workers", "1", "--log-every", "30", "--out", str(run)]
    env = dict(_env(), FLASHCHECK_ZYGOTE="0") if plain else _env()  # workers as plain `python -m` (no zygote)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    rec: dict[str, Any] = {
        "command": ("FLASHCHECK_ZYGOTE=0 " if plain else "") + " ".join(cmd[2:]),
        "exit": proc.returncode,
        "wall_s": round(time.perf_counter() - t0, 1),
        "log_tail": proc.stdout[-3000:],
    }
    try:
        meta = json.loads((run / "run.json").read_text())
        findings = json.loads((run / "findings.json").read_text())["findings"]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        rec["error"] = f"no run directory: {exc}; stderr: {proc.stderr[-2000:]}"
        return rec
    rec["stats"] = meta.get("stats", {})
    rec["stop_reason"] = meta.get("stop_reason") or meta.get("campaign", {}).get("stop_reason")
    rec["dropped_targets"] = meta.get("campaign", {}).get("dropped_targets", {})
    rec["targets_run"] = sorted(meta.get("checks_by_target", {}))  # the targets a worker set up in the budget
    per_target: dict[str, dict[str, int]] = {}
    replays = []
    for f in findings:
        tgt = f.get("location", {}).get("target", "?")
        per_target.setdefault(tgt, {})[f["id"]] = per_target.setdefault(tgt, {}).get(f["id"], 0) + 1
        r0 = time.perf_counter()
        rp = subprocess.run(
            [sys.executable, "-m", "flashcheck", "replay", str(run / f["repro"]), "--no-snippet"],
            env=_env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        replays.append(
            {
                "target": tgt,
                "id": f["id"],
                "check": f.get("evidence", {}).get("check"),
                "message": f["message"][:200],
                "replay_exit": rp.returncode,
                "reproduced": rp.returncode == 1,
                "replay_s": round(time.perf_counter() - r0, 1),
            }
        )
        print(json.dumps(replays[-1]), flush=True)
    rec["findings_by_target"] = per_target
    rec["replays"] = replays
    return rec


def sanitizer_mode(work: Path, seconds: int) -> dict[str, Any]:
    run = work / "campaign"
    try:
        findings = json.loads((run / "findings.json").read_text())["findings"]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        return {"error": f"no campaign findings to replay: {exc}"}
    faults = [f for f in findings if f["id"] == "FC250" and "CUDA error" in f["message"]]
    if not faults:
        return {"error": "the campaign recorded no kernel fault"}
    f = faults[0]
    cmd = [sys.executable, "-m", "flashcheck", "replay", str(run / f["repro"]), "--no-snippet"]
    cmd += ["--sanitizer", "memcheck"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=False, timeout=seconds)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text, rc = str(exc.stdout or ""), None
    part = text.split("compute-sanitizer --tool memcheck:", 1)
    rec = {
        "target": f.get("location", {}).get("target", "?"),
        "finding": f["message"][:200],
        "exit": rc,
        "sanitizer": ("compute-sanitizer --tool memcheck:" + part[1])[:6000] if len(part) == 2 else None,
        "wall_s": round(time.perf_counter() - t0, 1),
        "tail": text[-1500:],
    }
    print(json.dumps({k: v for k, v in rec.items() if k != "tail"}), flush=True)
    return rec


def plugin_mode(
    work: Path, budget: int, seconds_each: int, step_timeout: int, only: set[str] | None = None
) -> list[dict[str, Any]]:
    """`only`: class names, or {"all"} for every faulty target (default: one per family, `PLUGIN`); a step is hung
    after `step_timeout` seconds (FLASHCHECK_STEP_TIMEOUT; the first step of each kind gets five times that)."""
    env = dict(_env(), FLASHCHECK_STEP_TIMEOUT=str(step_timeout))
    from faulty_engine_gpu import FAULTY_ENGINE_TARGETS

    accepted = {c.__name__: acc for c, acc in FAULTY_ENGINE_TARGETS.values()}
    names = list(PLUGIN) if not only else [c for c in accepted if only == {"all"} or c in only]
    if only and only - {"all"} - set(accepted):
        raise SystemExit(
            f"--plugin-targets: unknown {sorted(only - {'all'} - set(accepted))}; choose from {sorted(accepted)}"
        )
    out = []
    for cls in names:
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "flashcheck.pytest_plugin",
            "-m",
            "fuzz",
            "--pyargs",
            "flashcheck.fuzzing.suite",
            "-k",
            "replay_sequences",
            "--flashcheck-target",
            f"faulty_engine_gpu:{cls}",
            "--flashcheck-budget",
            str(budget),
            "--flashcheck-out",
            str(work / f"plugin-{cls}"),
            "-q",
            "-p",
            "no:cacheprovider",
        ]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=seconds_each)
            text, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            text, rc = str(exc.stdout or ""), None
        ids = sorted(set(re.findall(r"\b(FC[1-3]\d\d) [a-z-]+", text)))
        rec = {
            "target": cls,
            "exit": rc,
            "accepted": list(accepted[cls]),
            "found": rc == 1 and bool(set(ids) & set(accepted[cls])),
            "checks_reported": ids,
            "wall_s": round(time.perf_counter() - t0, 1),
            "tail": text[-1500:],
        }
        print(json.dumps({k: v for k, v in rec.items() if k != "tail"}), flush=True)
        out.append(rec)
    return out


def _name(spec: str) -> str:
    """The name a faulty target reports findings under (`faulty_engine_gpu:NoReplanDecodeTC` -> no-replan-decode-tc)."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "-", spec.split(":", 1)[1]).lower()


def _collapse(text: str) -> list[str]:
    """The sanitizer's error list with each repeated (error, kernel) pair once and its count (a replay's output
    lists one pair per faulting thread up to the print limit)."""
    lines = text.splitlines()
    head, body = lines[:1], lines[1:]
    groups: dict[tuple[str, ...], int] = {}
    i = 0
    while i < len(body):
        j = i + 1
        while j < len(body) and body[j].startswith("    "):
            j += 1
        key = tuple(body[i:j])
        groups[key] = groups.get(key, 0) + 1
        i = j
    out = list(head)
    for key, n in groups.items():
        out += [key[0] + (f" (x{n})" if n > 1 else ""), *key[1:]]
    return out


def _campaign_lines(camp: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    st = camp.get("stats", {})
    lines += [
        f"Campaign: `{camp.get('command', '')}`: {st.get('steps')} steps in {st.get('elapsed_s')} s, "
        f"stop reason {camp.get('stop_reason')!r}, {st.get('restarts')} worker restarts, targets "
        f"dropped as unavailable: {camp.get('dropped_targets') or 'none'}.",
        "",
        "| target | findings | reproducers replayed in a fresh process (same finding) |",
        "|---|---|---|",
    ]
    by_target = camp.get("findings_by_target", {})
    replays = camp.get("replays", [])
    for tgt in sorted(by_target):
        mine = [r for r in replays if r["target"] == tgt]
        ok = sum(1 for r in mine if r["reproduced"])
        lines.append(f"| {tgt} | {by_target[tgt]} | {ok} of {len(mine)} |")
    m = re.search(r"--target (\S+)", camp.get("command", ""))
    specs = m.group(1).split(",") if m else []
    ran = camp.get("targets_run")
    reached = [t for t in specs if ran is None or (_name(t) if ":" in t else t) in ran]
    clean = [t for t in reached if ":" not in t and t not in by_target]
    missed = [t for t in reached if ":" in t and _name(t) not in by_target]
    lines += [
        "",
        f"Clean control without findings: {', '.join(clean) or 'none'}. Faulty targets without a finding: "
        f"{', '.join(missed) or 'none'}."
        + (
            " (This run does not record which targets it reached.)"
            if ran is None
            else f" Targets not reached in the time budget: {', '.join(t for t in specs if t not in reached)}."
            if len(reached) < len(specs)
            else ""
        ),
        "",
    ]
    return lines


def render(raw: Path) -> str:
    """reports/verdicts.md from the raw results in `raw` (verdicts-*.json, target_matrix-*.json): every figure in
    the report comes from a file there."""
    lines = [
        "# Verdicts on faulty engine targets",
        "",
        "Generated by `python benchmarks/verdicts.py --render reports/raw` from the raw results named in each",
        "section; regenerate it after re-running the benchmark. A finding counts only if its check is one the",
        "target's bug may produce (`accepted`); every target runs in an isolated worker.",
        "",
    ]
    for path in sorted(raw.glob("verdicts*.json")):
        doc = json.loads(path.read_text())
        env = doc.get("environment", {})
        lines += [
            f"## `{path.name}`",
            "",
            f"- command: `{doc.get('command', '')}`",
            f"- device {env.get('device', '?')}, torch {env.get('torch', '?')}, FlashInfer "
            f"{env.get('flashinfer', '?')}, date {doc.get('date', '?')}",
            "",
        ]
        if doc.get("driver"):
            lines += [
                "| target | found | check | steps to first | seconds to first | all findings |",
                "|---|---|---|---|---|---|",
            ]
            for r in doc["driver"]:
                found = "yes" if r.get("found") else f"**no** {r.get('error', r.get('skipped', ''))}"
                lines.append(
                    f"| {r['target']} | {found} | {r.get('check', '')} | {r.get('steps_to_first', '')} | "
                    f"{r.get('seconds_to_first', '')} | {r.get('findings', {})} |"
                )
            lines.append("")
        for key in ("campaign", "campaign_plain"):  # the zygote's workers, and plain `python -m` ones
            if doc.get(key):
                lines += _campaign_lines(doc[key])
        if doc.get("plugin"):
            lines += [
                "`pytest -m fuzz` through the plugin (`replay_sequences`):",
                "",
                "| target | pytest exit | checks reported | an accepted check | seconds |",
                "|---|---|---|---|---|",
            ]
            for r in doc["plugin"]:
                rc = "timed out" if r["exit"] is None else r["exit"]
                ok = {True: "yes", False: "**no**", None: ""}[r.get("found")]
                lines.append(
                    f"| {r['target']} | {rc} | {', '.join(r['checks_reported']) or 'none'} | {ok} | {r['wall_s']} |"
                )
            lines.append("")
        san = doc.get("sanitizer")
        if san:
            lines += [
                f"Kernel-fault reproducer of `{san.get('target', '?')}` under compute-sanitizer memcheck "
                f"(replay exit {san.get('exit')}, {san.get('wall_s')} s):",
                "",
                "```",
            ]
            lines += _collapse((san.get("sanitizer") or san.get("error") or "no sanitizer output").rstrip())
            lines += ["```", ""]
    for path in sorted(raw.glob("verdicts*.log")):
        lines += [
            f"## `{path.name}` (printed by the run)",
            "",
            "```",
            *path.read_text().rstrip().splitlines(),
            "```",
            "",
        ]
    for path in sorted(raw.glob("target_matrix-*.json")):
        doc = json.loads(path.read_text())
        lines += [
            f"## Built-in targets: `{path.name}`",
            "",
            f"- command: `{doc.get('command', '')}`",
            "",
            "| target | status | steps | findings | known upstream behaviours |",
            "|---|---|---|---|---|",
        ]
        for r in doc.get("results", []):
            lines.append(
                f"| {r['target']} | {r['status']} | {r.get('steps', '')} | {r.get('findings', {})} | "
                f"{r.get('known', {})} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="driver,campaign,sanitizer,plugin")
    p.add_argument("--steps", type=int, default=60, help="driver mode: steps per target at most")
    p.add_argument("--driver-targets", default="", help="driver mode: comma-separated names (default: all)")
    p.add_argument("--driver-seconds", type=int, default=240)
    p.add_argument("--campaign-seconds", type=int, default=150)
    p.add_argument("--plugin-budget", type=int, default=8, help="examples per plugin run")
    p.add_argument("--plugin-targets", default="", help="plugin mode: comma-separated classes (default: all)")
    p.add_argument("--plugin-seconds", type=int, default=120, help="wall limit of one plugin run")
    p.add_argument("--sanitizer-seconds", type=int, default=240, help="wall limit of the sanitizer replay")
    p.add_argument("--step-timeout", type=int, default=30)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", default="/tmp/flashcheck-verdicts")
    p.add_argument("--out", default=None)
    p.add_argument("--render", metavar="RAW_DIR", default=None, help="write reports/verdicts.md from RAW_DIR and stop")
    a = p.parse_args()
    if a.render:
        (ROOT / "reports" / "verdicts.md").write_text(render(Path(a.render)))
        return 0
    sys.path[:0] = [str(ROOT / "src"), str(QUALITY)]
    from flashcheck.rundir import environment

    env = environment(probe=True)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "environment": env}
    modes = a.modes.split(",")

    def save() -> None:
        if a.out:
            Path(a.out).write_text(json.dumps(doc, indent=2, default=str))

    if "driver" in modes:
        only = set(filter(None, a.driver_targets.split(",")))
        doc["driver"] = driver_mode(a.steps, a.seed, a.step_timeout, time.monotonic() + a.driver_seconds, only)
        save()
    if "campaign" in modes:
        doc["campaign"] = campaign_mode(work, a.campaign_seconds, a.step_timeout, a.seed)
        save()
    if "campaign-plain" in modes:  # the same campaign with every worker a plain `python -m` (FLASHCHECK_ZYGOTE=0)
        doc["campaign_plain"] = campaign_mode(work / "plain", a.campaign_seconds, a.step_timeout, a.seed, plain=True)
        save()
    if "sanitizer" in modes:
        doc["sanitizer"] = sanitizer_mode(work, a.sanitizer_seconds)
        save()
    if "plugin" in modes:
        only_plugin = set(filter(None, a.plugin_targets.split(",")))
        doc["plugin"] = plugin_mode(work, a.plugin_budget, a.plugin_seconds, a.step_timeout, only_plugin)
        save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
