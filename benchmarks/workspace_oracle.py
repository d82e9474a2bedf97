"""GPU confirmation of the workspace oracle on this machine's FlashInfer; raw JSON for reports/workspace-oracle.md.

For the Llama-3-8B decode and prefill, DeepSeek-V3 MLA (TP8) and too-small (64 heads, 16 MiB) presets: each float
witness runs on the real wrapper at the oracle's bound (must run clean, high-water within the bound) and one byte
below its need (must overflow, FC302); on 0.7 ``workspace_size()`` is compared per witness. Then every built-in
target runs its generated steps under the arena and each workspace's high-water mark is compared with the bound
(on 0.7 with ``workspace_size()`` of every eager plan against the oracle's planner for that batch).
Finally the too-small preset's witness reproducers are replayed (each must reproduce the overflow).

    python benchmarks/workspace_oracle.py --steps 200 --out reports/raw/workspace_oracle-0.6.13.json
    python benchmarks/workspace_oracle.py --render      # reports/workspace-oracle.md from reports/raw
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

CONFIRM_PRESETS = ("llama3-8b-decode", "llama3-8b-prefill", "deepseek-v3-mla-tp8", "prefill-64h-16mib")
ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "reports" / "raw"
REPORT = ROOT / "reports" / "workspace-oracle.md"


def _guard(what: str, fn: Any, *a: Any, **k: Any) -> Any:
    """Run one piece; an error is recorded (with its traceback) instead of ending the run."""
    t0 = time.perf_counter()
    try:
        out = fn(*a, **k)
        status = "ran"
    except Exception as exc:  # one failing piece must not lose the others' evidence
        out = {"error": f"{type(exc).__name__}: {exc}"[:500], "traceback": traceback.format_exc()[-2000:]}
        status = "error"
    print(f"[{time.perf_counter() - t0:6.1f}s] {what}: {status}", flush=True)
    return {"what": what, "status": status, "wall_s": round(time.perf_counter() - t0, 2), "result": out}


def replay_witnesses(name: str) -> list[dict[str, Any]]:
    from flashcheck.repro import load_repro, replay_repro
    from flashcheck.workspace import preset, run_oracle
    from flashcheck.workspace.confirm import installed_rules
    from flashcheck.workspace.report import findings

    rules = installed_rules()
    out = []
    with tempfile.TemporaryDirectory() as d:
        for f in findings(run_oracle(preset(name)), Path(d)):
            if f.repro is None or f.evidence.get("flashinfer_rules") != rules:
                continue
            found, hit = replay_repro(load_repro(f.repro), device="cuda")
            out.append({"finding": f.message, "repro": Path(f.repro).name, "reproduced": hit,
                        "replay_findings": [g.message[:300] for g in found]})  # fmt: skip
    return out


def run(doc: dict[str, Any], presets: list[str], targets: list[str], steps: int, save: Any) -> None:
    """Every piece in turn, saving the document after each (a run cut short keeps what it measured)."""
    from flashcheck.workspace import preset, run_oracle
    from flashcheck.workspace.confirm import confirm_result, fuzz_within_bounds

    for name in presets:
        doc["witnesses"].append(_guard(f"witnesses {name}", confirm_result, run_oracle(preset(name))))
        save()
    if "prefill-64h-16mib" in presets:
        doc["replays"].append(_guard("replay prefill-64h-16mib", replay_witnesses, "prefill-64h-16mib"))
        save()
    for name in targets:
        doc["fuzz"].append(_guard(f"fuzz {name}", fuzz_within_bounds, name, run_oracle(preset(name)), steps=steps))
        save()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--targets", default=None, help="comma-separated built-in targets (default: all; none: skip)")
    p.add_argument("--presets", default=",".join(CONFIRM_PRESETS), help="presets whose witnesses run (none: skip)")
    p.add_argument("--out", default=None)
    p.add_argument("--render", action="store_true", help="only render reports/workspace-oracle.md from reports/raw")
    a = p.parse_args()
    if a.render:
        REPORT.write_text(render(sorted(RAW.glob("workspace_oracle-*.json"))), encoding="utf-8")
        print(f"wrote {REPORT}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("workspace_oracle: cannot run here: no CUDA device (use --render to render existing results)")
        return 3
    from flashcheck.rundir import environment
    from flashcheck.targets.flashinfer.compat import load_flashinfer
    from flashcheck.targets.registry import GPU_TARGETS

    fi = load_flashinfer()
    env = {**environment(probe=True), "flashinfer": fi.version}
    targets = _names(a.targets, list(GPU_TARGETS))
    presets = _names(a.presets, list(CONFIRM_PRESETS))
    doc: dict[str, Any] = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "environment": env}
    doc.update(witnesses=[], fuzz=[], replays=[])

    def save() -> None:
        if a.out:
            Path(a.out).write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")

    run(doc, presets, targets, a.steps, save)
    print(render_one(doc))
    return 0


def _names(arg: str | None, default: list[str]) -> list[str]:
    if arg is None:
        return default
    return [] if arg == "none" else [n for n in arg.split(",") if n]


def render_one(doc: dict[str, Any]) -> str:
    env = doc.get("environment", {})
    lines = [f"### FlashInfer {env.get('flashinfer')} on {env.get('device')} ({doc.get('date', '')})", ""]
    lines.append(f"`{doc.get('command', '')}`")
    lines += ["", "| configuration | use | bound (B) | witness | high-water at bound (B) | one byte below its need |"]
    lines.append("|---|---|---:|---|---:|---|")
    for piece in doc.get("witnesses", []):
        res = piece["result"]
        if piece["status"] != "ran":
            lines.append(f"| {piece['what']} | error: {res.get('error')} | | | | |")
            continue
        for r in res:
            below = "overflows (FC302)" if r.get("overflows_below_need") else "**runs: bound not tight**"
            if r.get("searched") == 0:
                below = "needs 0 B"
            hw = r.get("high_water", "-")
            lines.append(
                f"| {r['config']} | {r['use']} | {r['bound']:,} | {r.get('witness')} | {hw:,} | {below} |"
                if isinstance(hw, int)
                else f"| {r['config']} | {r['use']} | {r['bound']:,} | {r.get('witness')} | - | {r['status']} |"
            )
            if "workspace_size_absent" in r:
                lines.append(f"| | `workspace_size()` | not offered | oracle {r['oracle_plan']} | | not compared |")
            elif "workspace_size_agrees" in r and not r["workspace_size"]:  # no plan reported a size
                lines.append(f"| | `workspace_size()` | none recorded | oracle {r['oracle_plan']} | | not compared |")
            elif "workspace_size_agrees" in r:
                agree = "agrees" if r["workspace_size_agrees"] else "**differs**"
                ws = r["workspace_size"][-1]
                lines.append(f"| | `workspace_size()` | {ws} | oracle {r['oracle_plan']} | | {agree} |")
    lines += [
        "",
        "| target | steps | workspace | max high-water (B) | bound (B) | within |",
        "|---|---:|---|---:|---:|---|",
    ]
    cmp_lines: list[str] = []
    for piece in doc.get("fuzz", []):
        res = piece["result"]
        if piece["status"] != "ran":
            lines.append(f"| {piece['what']} | | error: {res.get('error')} | | | |")
            continue
        ws = res.get("workspace_size")
        if ws:
            cmp_lines.append(
                f"| {res['target']} | {ws['equal']} | {ws['oracle_larger']} | {ws['oracle_smaller']} | "
                f"{ws['not_comparable']} | {ws['examples'][:1]} |"
            )
        for w in res["workspaces"]:
            ok = "yes" if w["within"] else "**NO**"
            lines.append(
                f"| {res['target']} | {res['steps']} | {w['workspace']} | {w['high_water']:,} | {w['bound']:,} | {ok} |"
            )
    if cmp_lines:
        lines += [
            "",
            "`workspace_size()` of every eager plan of the fuzzed run against the oracle's planner for that batch:",
        ]
        lines += ["", "| target | equal | oracle larger | oracle smaller | not comparable | first difference |"]
        lines += ["|---|---:|---:|---:|---:|---|", *cmp_lines]
    for piece in doc.get("replays", []):
        lines.append("")
        if piece["status"] != "ran":
            lines.append(f"{piece['what']}: error {piece['result'].get('error')}")
            continue
        for r in piece["result"]:
            # FlashInfer's message names its header by the install path of the machine that ran it: keep the package
            first = [re.sub(r"at \S*?/(flashinfer/data/include/)", r"at \1", m) for m in r["replay_findings"][:1]]
            lines.append(f"- replay `{r['repro']}`: reproduced={r['reproduced']}: {first}")
    return "\n".join(lines) + "\n"


def render(paths: list[Path]) -> str:
    head = [
        "# Workspace oracle on the GPU",
        "",
        "Rendered by `python benchmarks/workspace_oracle.py --render` from `reports/raw/workspace_oracle-*.json`.",
        "Each witness is planned at the oracle's bound (must run clean within it) and one byte below the bytes it",
        "needs (must overflow); every built-in target's generated steps stay within the bound.",
        "",
    ]
    if not paths:
        head.append("No raw results yet: run `benchmarks/workspace_oracle.py --out RAW.json` on a GPU.")
    body = [render_one(json.loads(p.read_text(encoding="utf-8"))) for p in paths]
    return "\n".join(head) + "\n" + "\n".join(body)


if __name__ == "__main__":
    raise SystemExit(main())
