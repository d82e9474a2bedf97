"""reports/gpu-evidence.md from the raw GPU results in reports/raw: the built-in targets under every property
(`target_matrix.py`), the seed bugs (`seed_bugs.py`), the runtime checker's overhead (`runtime_overhead.py`), fuzz
throughput (`fuzz_throughput.py`), where a driver step spends its time (`driver_phases.py`) and how long an isolated
worker takes to start and restart (`worker_start.py`). Every figure in the
page comes from a file there; re-run the benchmark that
produced a file when the code it covers changes, then regenerate:

    python benchmarks/render_evidence.py            # writes reports/gpu-evidence.md
    python benchmarks/render_evidence.py --check    # exit 1 when the page differs from what the raw files give
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "reports" / "raw"
PAGE = ROOT / "reports" / "gpu-evidence.md"


def _env_line(env: Mapping[str, Any], date: str | None) -> str:
    if not env and not date:
        return "- the environment and the date are not recorded in this file"
    missing = env.get("flashinfer_missing")
    return (
        f"- device {env.get('device', '?')}, torch {env.get('torch', '?')}, FlashInfer {env.get('flashinfer', '?')}, "
        f"date {date or 'not recorded in the file'}"
        + (f"; FlashInfer's requirements not installed: {', '.join(missing)}" if missing else "")
    )


def _head(path: Path, doc: Mapping[str, Any], columns: str, *, how: str = "", more: tuple[str, ...] = ()) -> list[str]:
    """A result file's heading: its name, command (with `how` it ran), environment and date, `more` lines, then the
    table's header row."""
    env = doc.get("environment") or doc.get("versions") or {}
    return [
        f"### `{path.name}`",
        "",
        f"- command: `{doc.get('command', '')}`" + (f" ({how})" if how else ""),
        _env_line(env, doc.get("date")),
        *more,
        "",
        columns,
        "|---" * columns.count(" | ") + "|---|",
    ]


def _matrix(path: Path, doc: Mapping[str, Any]) -> list[str]:
    lines = _head(
        path, doc, "| target | status | steps (capture/replay/eager) | findings | known upstream behaviours |"
    )
    for r in doc.get("results", []):
        ops = r.get("ops") or {}
        steps = f"{r.get('steps', 0)} ({ops.get('capture', 0)}/{ops.get('replay', 0)}/{ops.get('eager', 0)})"
        status = (
            r["status"] if r["status"] == "ran" else f"{r['status']}: {(r.get('reason') or r.get('error', ''))[:160]}"
        )
        lines.append(
            f"| {r['target']} | {status} | {steps} | {r.get('findings') or 'none'} | {r.get('known') or 'none'} |"
        )
    return [*lines, ""]


def _seeds(path: Path, doc: Mapping[str, Any]) -> list[str]:
    lines = _head(path, doc, "| seed-bug target | intended property | found | steps to first | seconds to first |")
    for r in doc.get("results", []):
        found = "yes" if r.get("found") else f"**no** {r.get('error', '')[:120]}"
        lines.append(
            f"| {r['target']} | {r.get('property')} | {found} | {r.get('steps_to_first', '')} | "
            f"{r.get('seconds_to_first', '')} |"
        )
    return [*lines, ""]


def _overhead(path: Path, doc: Mapping[str, Any]) -> list[str]:
    cfg = doc.get("config", {})
    lines = _head(
        path,
        doc,
        "| checker layers | µs per replay step | × no checker | × no checker, paired by round | host µs per step "
        "| host µs added, paired | × no checker, host, paired | drain (ms) | layers |",
        how=f"steps {cfg.get('steps')}, rounds {cfg.get('rounds')}, median of the rounds",
    )
    for mode, m in doc.get("modes", {}).items():
        lines.append(
            f"| {mode} | {m['us_per_step_median']:.1f} | {m['ratio_to_off']:.2f} | "
            f"{_paired(m)} | {_num(m, 'host_us_per_step_median', '.1f')} | {_num(m, 'host_added_us_paired', '.1f')} | "
            f"{_num(m, 'host_ratio_paired', '.2f')} | {m['drain_ms_median']:.1f} | "
            f"{', '.join(m.get('layers', [])) or '-'} |"
        )
    if doc.get("note"):
        lines += ["", f"Note: {doc['note']}."]
    return [*lines, ""]


def _num(mode: Mapping[str, Any], key: str, fmt: str) -> str:
    value = mode.get(key)
    return format(value, fmt) if isinstance(value, (int, float)) else "not recorded"


def _paired(mode: Mapping[str, Any]) -> str:
    paired = mode.get("ratio_to_off_paired")
    return f"{paired:.2f}" if isinstance(paired, (int, float)) else "not recorded"


def _throughput(path: Path, doc: Mapping[str, Any]) -> list[str]:
    rounds = doc.get("rounds")
    how = (
        f"{rounds} rounds of {doc.get('seconds_per_mode')} s per mode, the modes of a layer setting one after another"
        " in each round; a mode's steps/s is the median of its rounds"
        if rounds
        else f"{doc.get('seconds_per_mode')} s per mode, all modes one after another"
    )
    lines = [
        f"### `{path.name}`",
        "",
        f"- command: `{' '.join(doc.get('argv', []))}` (target {doc.get('target')}, {how}, in one process)",
        _env_line(doc.get("environment", {}), doc.get("date")),
        "",
        "| mode | steps/s | slowest and fastest round | over all rounds "
        "| × plain `@given` (the faster of its two runs) | mean batch | mean KV tokens per step |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc.get("results", []):
        spread = f"{min(r['rounds']):.1f} – {max(r['rounds']):.1f}" if r.get("rounds") else "-"
        overall = f"{r['overall_per_second']:.1f}" if r.get("overall_per_second") else "-"
        lines.append(
            f"| {r['mode']} | {r['per_second']:.1f} | {spread} | {overall} | {r.get('vs_given', 0):.2f} | "
            f"{r.get('mean_batch', 0):.1f} | {r.get('mean_kv_tokens', 0):.0f} |"
        )
    return [*lines, ""]


def _phases(path: Path, doc: Mapping[str, Any]) -> list[str]:
    cfg, by_layers = doc.get("config", {}), doc.get("layers", {})
    names = list(by_layers)
    lines = _head(
        path,
        doc,
        "| phase (ms per step) | " + " | ".join(f"layers {n}" for n in names) + " |",
        how=f"target {cfg.get('target')}, {cfg.get('steps')} timed steps per layer setting, the same steps for each",
        more=("- steps/s: " + ", ".join(f"{n} {by_layers[n]['steps_per_s']:.1f}" for n in names),),
    )
    order: list[str] = []
    for n in names:
        order += [label for label in by_layers[n]["phases"] if label not in order]
    for label in order:
        cells = [by_layers[n]["phases"].get(label, {}).get("ms_per_step") for n in names]
        lines.append(f"| {label} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    lines.append("| **whole step** | " + " | ".join(f"**{by_layers[n]['ms_per_step']:.3f}**" for n in names) + " |")
    return [*lines, ""]


def _worker_start(path: Path, doc: Mapping[str, Any]) -> list[str]:
    lines = _head(path, doc, "| worker | first start (s) | restart, median (s) | each restart (s) | forked |")
    for name, r in doc.get("settings", {}).items():
        each = ", ".join(f"{s:.2f}" for s in r.get("restart_s", []))
        lines.append(
            f"| {name} | {r['first_s']:.2f} | {r['restart_median_s']:.2f} | {each} | {'yes' if r['forked'] else 'no'} |"
        )
    return [*lines, ""]


SECTIONS = (
    ("Built-in targets under every property", "target_matrix-*.json", _matrix),
    ("Seed bugs, each found by its intended property", "seed_bugs-*.json", _seeds),
    ("Runtime checker overhead on a graph replay loop", "runtime_overhead-*.json", _overhead),
    ("Fuzz throughput beside a plain Hypothesis loop", "fuzz_throughput-*.json", _throughput),
    ("Where a driver step spends its wall time", "driver_phases-*.json", _phases),
    ("Isolated worker start and restart (until its session answers)", "worker_start-*.json", _worker_start),
)


def render(raw: Path = RAW) -> str:
    lines = [
        "# GPU evidence",
        "",
        "Generated by `python benchmarks/render_evidence.py` from the raw results in `reports/raw/` named in each",
        "section (the verdicts on faulty engine targets are in [verdicts.md](verdicts.md)). Each section shows the",
        "command that produced its file, the device, the versions and the date the file records.",
        "",
    ]
    for title, pattern, fn in SECTIONS:
        files = sorted(raw.glob(pattern))
        lines += [f"## {title}", ""]
        if not files:
            lines += ["No result file.", ""]
        for path in files:
            lines += fn(path, json.loads(path.read_text(encoding="utf-8")))
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 when reports/gpu-evidence.md is not up to date")
    a = p.parse_args()
    text = render()
    if a.check:
        if PAGE.read_text(encoding="utf-8") != text:
            print("reports/gpu-evidence.md differs from reports/raw: run python benchmarks/render_evidence.py")
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
