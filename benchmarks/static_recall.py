"""Recall and near-miss false positives of `flashcheck static` on the annotated rule fixtures.

Every ``# expect: FC10x`` line of ``tests/rules/fixtures`` is a labelled bug site and every ``# ok: FC10x`` line a
labelled near miss. A fixture is a file, or a directory checked as one project with its own ``pyproject.toml``
(hot-path configuration included). Writes ``reports/raw/static_recall.json`` and ``reports/static-recall.md``.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/static_recall.py [--label after] [--json PATH] [--md PATH]
    git archive 4397925 src | tar -x -C /tmp/before && PYTHONPATH=/tmp/before/src .venv/bin/python \
        benchmarks/static_recall.py --label before --source-commit 4397925     # an older verifier, same fixtures

Configuration keys that the checked-out verifier does not know are dropped and listed (so an older verifier can be
measured on the same fixtures).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import tomllib

from flashcheck.verifier import StaticConfig, check_paths

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "rules" / "fixtures"
HELDOUT = ROOT / "benchmarks" / "static_heldout"
# the held-out projects by batch, in the order they were written (benchmarks/static_heldout/batches.toml)
HELDOUT_BATCHES: dict[str, tuple[str, ...]] = {
    name: tuple(projects) for name, projects in tomllib.loads((HELDOUT / "batches.toml").read_text()).items()
}
_ANNOTATION = re.compile(r"#\s*(expect|ok):\s*(FC\d{3}(?:\s*,\s*FC\d{3})*)")


def marks(path: Path) -> dict[str, set[tuple[str, int]]]:
    """{"expect"|"ok": {(rule ID, line)}} of one file."""
    out: dict[str, set[tuple[str, int]]] = {"expect": set(), "ok": set()}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        for kind, ids in _ANNOTATION.findall(line):
            for rule_id in re.split(r"\s*,\s*", ids):
                out[kind].add((rule_id, lineno))
    return out


def fixture_config(target: Path) -> tuple[StaticConfig, list[str]]:
    base = target if target.is_dir() else target.parent
    known = {f.name for f in dataclasses.fields(StaticConfig)}
    values: dict[str, Any] = {"root": str(base)}
    dropped: list[str] = []
    pyproject = base / "pyproject.toml"
    if target.is_dir() and pyproject.is_file():
        table = tomllib.loads(pyproject.read_text())["tool"]["flashcheck"]["static"]
        for key, value in table.items():
            name = key.replace("-", "_")
            if name in known:
                values[name] = tuple(value) if isinstance(value, list) else value
            else:
                dropped.append(key)
    return StaticConfig(**values), dropped


def measure(target: Path) -> dict[str, Any]:
    config, dropped = fixture_config(target)
    result = check_paths([str(target)], config)
    base = target if target.is_dir() else target.parent
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    fired = {(f.location.file, f.id, f.location.line) for f in result.findings}
    per_rule: dict[str, dict[str, int]] = defaultdict(lambda: {"expect": 0, "hit": 0, "ok": 0, "false_positive": 0})
    missed: list[str] = []
    noisy: list[str] = []
    for path in files:
        rel = path.relative_to(base).as_posix()
        m = marks(path)
        for rule_id, line in sorted(m["expect"]):
            per_rule[rule_id]["expect"] += 1
            if (rel, rule_id, line) in fired:
                per_rule[rule_id]["hit"] += 1
            else:
                missed.append(f"{rel}:{line} {rule_id}")
        for rule_id, line in sorted(m["ok"]):
            per_rule[rule_id]["ok"] += 1
            if (rel, rule_id, line) in fired:
                per_rule[rule_id]["false_positive"] += 1
                noisy.append(f"{rel}:{line} {rule_id}")
    return {
        "fixture": target.relative_to(HELDOUT.parent if HELDOUT in target.parents else FIXTURES).as_posix(),
        "per_rule": dict(per_rule),
        "missed": missed,
        "false_positives": noisy,
        "dropped_config_keys": dropped,
        "internal_errors": result.internal_errors,
    }


def _batch_totals(run: dict[str, Any], batch: str) -> dict[str, Any] | None:
    """`totals` over the held-out projects of `batch` in `run` (None when the run has none of them)."""
    found: dict[str, Any] | None = run["batches"].get(batch)
    return found


def _rule_totals(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Bug sites and near misses of `rows` by rule: {rule ID: {expect, hit, ok, false_positive}}."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"expect": 0, "hit": 0, "ok": 0, "false_positive": 0})
    for r in rows:
        for rule_id, v in r["per_rule"].items():
            for key in ("expect", "hit", "ok", "false_positive"):
                out[rule_id][key] += v[key]
    return dict(sorted(out.items()))


def compact(run: dict[str, Any]) -> dict[str, Any]:
    """`run` as the JSON keeps it: totals by held-out batch and by rule, and the rows of the fixtures with something
    to show (a missed bug site, a flagged near miss, a dropped configuration key or an internal error); every other
    fixture found each of its bug sites and flagged none of its near misses. A compact run is returned as it is."""
    if "batches" in run:
        return run
    rows = run["fixtures"]
    heldout = [r for r in rows if r["fixture"].startswith("static_heldout/")]
    batches = {}
    for batch, projects in HELDOUT_BATCHES.items():
        chosen = [r for r in heldout if r["fixture"].removeprefix("static_heldout/") in projects]
        if chosen:
            batches[batch] = totals(chosen)
    shown = [r for r in rows if r["missed"] or r["false_positives"] or r["dropped_config_keys"] or r["internal_errors"]]
    others = [r for r in rows if r not in heldout]
    per_rule = {"all_fixtures": _rule_totals(others), "heldout": _rule_totals(heldout)}
    return {**run, "batches": batches, "per_rule": per_rule, "fixtures": shown}


def _blind_summary(doc: dict[str, Any]) -> str:
    """``batch 2 51/54, 0/53; ...`` from each `blind (batch N unseen)` run, for its own batch."""
    parts = []
    for batch in HELDOUT_BATCHES:
        run = doc["runs"].get(f"blind ({batch} unseen)")
        t = _batch_totals(run, batch) if run else None
        if t is not None:
            parts.append(f"{batch} {t['hit']}/{t['expect']}, {t['false_positive']}/{t['ok']}")
    return "; ".join(parts) or "none yet"


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    expect = sum(v["expect"] for r in rows for v in r["per_rule"].values())
    hit = sum(v["hit"] for r in rows for v in r["per_rule"].values())
    ok = sum(v["ok"] for r in rows for v in r["per_rule"].values())
    fp = sum(v["false_positive"] for r in rows for v in r["per_rule"].values())
    return {
        "expect": expect,
        "hit": hit,
        "recall": round(hit / expect, 4) if expect else None,
        "ok": ok,
        "false_positive": fp,
        "near_miss_fp_rate": round(fp / ok, 4) if ok else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="current", help="name of this measurement in the JSON (before/after)")
    ap.add_argument(
        "--source-commit",
        default=None,
        help="the commit whose src/ is on PYTHONPATH, when it is not this checkout's HEAD (e.g. an older verifier "
        "unpacked with `git archive REV src`)",
    )
    ap.add_argument("--json", default=str(ROOT / "reports" / "raw" / "static_recall.json"))
    ap.add_argument("--md", default=str(ROOT / "reports" / "static-recall.md"))
    args = ap.parse_args(argv)
    targets = sorted(
        p for p in FIXTURES.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name.startswith("engine_"))
    )
    targets += sorted(p for p in HELDOUT.iterdir() if p.is_dir())
    rows = [measure(t) for t in targets]
    engine = [r for r in rows if r["fixture"].startswith("engine_")]
    heldout = [r for r in rows if r["fixture"].startswith("static_heldout/")]
    rows = [r for r in rows if r not in heldout]
    git = ["git", "rev-parse", "--short", args.source_commit or "HEAD"]
    rev = subprocess.run(git, check=False, cwd=ROOT, capture_output=True, text=True).stdout
    run = {
        "label": args.label,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "commit": rev.strip(),
        "engine_fixtures": totals(engine),
        "all_fixtures": totals(rows),
        "heldout": totals(heldout),
        "fixtures": rows + heldout,
    }
    path = Path(args.json)
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    doc["runs"] = {label: compact(r) for label, r in doc["runs"].items()}
    doc["runs"][args.label] = compact(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    Path(args.md).write_text(render(doc))
    e = run["engine_fixtures"]
    h = run["heldout"]
    print(f"{args.label}: engine recall {e['hit']}/{e['expect']}, near-miss FP {e['false_positive']}/{e['ok']}")
    print(f"{args.label}: held-out recall {h['hit']}/{h['expect']}, near-miss FP {h['false_positive']}/{h['ok']}")
    return 0


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.1f}%)" if d else "-"


def render(doc: dict[str, Any]) -> str:
    lines = [
        "# `flashcheck static` recall and near-miss false positives on the annotated fixtures",
        "",
        "Generated by `benchmarks/static_recall.py` from `reports/raw/static_recall.json`. A bug site is a",
        "`# expect: FC10x` line, a near miss an `# ok: FC10x` line of `tests/rules/fixtures`; the engine fixtures",
        "(`engine_*/`, SGLang-, vLLM-, TensorRT-LLM- and rtp-llm-shaped projects with their own hot-path",
        "configuration) are counted apart from the per-rule fixtures. The engine fixtures were written together with",
        "the analysis they measure. The held-out samples (`benchmarks/static_heldout/`) are written in batches after",
        "the analysis, by someone who reads the rule pages but not the analysis; a batch measures recall on unseen",
        "code until its misses guide a change. Each batch from 2 on was measured blind, in the run `blind (batch N",
        "unseen)`, before its misses guided the fixes that followed (one label of batch 4 was corrected after its",
        "writer saw the output: a line that read no data, marked as a sync; no other label was corrected). Each",
        "batch on its own in its blind run (recall, near-miss false positives): " + _blind_summary(doc) + "; the",
        "last is the latest estimate for code the analysis has not seen.",
        "Every run is measured over every batch, so a row shows what a later batch would have found at that commit.",
        "Each run's section below gives its totals by rule and names the bug sites it missed and the near misses it",
        "flagged; the JSON keeps each run's totals by batch and by rule and the rows of the fixtures with a miss, a",
        "flagged near miss, a dropped configuration key or an internal error.",
        "",
        "| run | date | commit | engine recall | engine near-miss FP | held-out recall | held-out near-miss FP "
        "| all fixtures recall | all fixtures near-miss FP |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, run in doc["runs"].items():
        e, a = run["engine_fixtures"], run["all_fixtures"]
        h = run.get("heldout") or {"hit": 0, "expect": 0, "false_positive": 0, "ok": 0}
        lines.append(
            f"| {label} | {run['date']} | {run['commit']} | {_pct(e['hit'], e['expect'])} | "
            f"{_pct(e['false_positive'], e['ok'])} | {_pct(h['hit'], h['expect'])} | "
            f"{_pct(h['false_positive'], h['ok'])} | {_pct(a['hit'], a['expect'])} | "
            f"{_pct(a['false_positive'], a['ok'])} |"
        )
    lines += ["", "Held-out samples by batch (recall, near-miss false positives):", ""]
    lines += ["| run | " + " | ".join(HELDOUT_BATCHES) + " |", "|---|" + "---|" * len(HELDOUT_BATCHES)]
    for label, run in doc["runs"].items():
        cells = []
        for batch in HELDOUT_BATCHES:
            t = _batch_totals(run, batch)
            cells.append(f"{_pct(t['hit'], t['expect'])}, {_pct(t['false_positive'], t['ok'])}" if t else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for label, run in doc["runs"].items():
        lines += ["", f"## {label}: `{run['command']}` (Python {run['python']})", ""]
        lines += [
            "| rule | fixtures: bug sites found | fixtures: near misses flagged | held-out: bug sites found "
            "| held-out: near misses flagged |",
            "|---|---|---|---|---|",
        ]
        fixtures, heldout = run["per_rule"]["all_fixtures"], run["per_rule"]["heldout"]
        zero = {"expect": 0, "hit": 0, "ok": 0, "false_positive": 0}
        for rule_id in sorted(set(fixtures) | set(heldout)):
            f, h = fixtures.get(rule_id, zero), heldout.get(rule_id, zero)
            lines.append(
                f"| {rule_id} | {_pct(f['hit'], f['expect'])} | {_pct(f['false_positive'], f['ok'])} | "
                f"{_pct(h['hit'], h['expect'])} | {_pct(h['false_positive'], h['ok'])} |"
            )
        missed = [f"{r['fixture']}/{m}" for r in run["fixtures"] for m in r["missed"]]
        noisy = [f"{r['fixture']}/{m}" for r in run["fixtures"] for m in r["false_positives"]]
        dropped = sorted({k for r in run["fixtures"] for k in r["dropped_config_keys"]})
        errors = [f"{r['fixture']}: {e}" for r in run["fixtures"] for e in r["internal_errors"]]
        lines += ["", f"Missed bug sites ({len(missed)}): " + (", ".join(f"`{m}`" for m in missed) or "none")]
        lines += ["", f"Flagged near misses ({len(noisy)}): " + (", ".join(f"`{m}`" for m in noisy) or "none")]
        if dropped:
            lines += ["", "Configuration keys this verifier does not know (dropped): " + ", ".join(dropped)]
        if errors:
            lines += ["", f"Internal errors ({len(errors)}): " + "; ".join(f"`{e}`" for e in errors)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
