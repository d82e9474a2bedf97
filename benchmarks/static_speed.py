"""Speed and memory of ``flashcheck static`` over a large tree, side by side with ``ruff check --select E,F``.

Each tool runs in its own child process (the default tree is the installed torch package's Python sources, located
without importing torch), ``--repeat`` times. flashcheck runs three ways each time: without the summary cache, with
a new (cold) cache directory, and again with that directory warm (every summary loaded, no file parsed); ``--jobs``
processes each (default: one per CPU). For each run the wall time, the CPU time (user + system, the child's
processes included) and the peak resident memory (of its largest process) are recorded, and the best run of each
kind is reported. The machine may be shared: CPU time is the figure that load on other processes does not inflate,
and the load average is recorded before and after. Writes ``reports/raw/static_speed.json`` and
``reports/static-speed.md``. Timed assertions do not belong in tests; this script only measures.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/static_speed.py [PATH ...] [--repeat N] [--jobs N]
        [--before REV]

``--before REV`` adds a column for the verifier of commit REV of this repository (its ``src/``, unpacked with
``git archive`` into a temporary directory), run the same number of times in between, so a change is measured
against its base under the same load.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_CHILD = """
import json, sys
from collections import Counter
from flashcheck.verifier import StaticConfig, check_paths
jobs, cache, paths = int(sys.argv[1]), sys.argv[2] or None, sys.argv[3:]
root = paths[0]
result = check_paths(paths, StaticConfig(root=root, jobs=jobs, cache_dir=cache))
print(json.dumps({"files": len(result.files), "lines": result.lines, "roots": result.roots,
                  "findings_per_rule": dict(sorted(Counter(f.id for f in result.findings).items())),
                  "internal_errors": len(result.internal_errors), "jobs": result.jobs, "cached": result.cached}))
"""
_BEFORE_CHILD = """
import json, sys
from collections import Counter
from flashcheck.verifier import StaticConfig, check_paths
result = check_paths(sys.argv[1:], StaticConfig(root=sys.argv[1]))
print(json.dumps({"findings_per_rule": dict(sorted(Counter(f.id for f in result.findings).items()))}))
"""
_KINDS = {"flashcheck": "no cache", "flashcheck_cold": "cold cache", "flashcheck_warm": "warm cache"}


def torch_sources() -> str:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed; pass a PATH to benchmark")
    return str(next(iter(spec.submodule_search_locations)))


def torch_version(root: str) -> str:
    version_py = Path(root) / "version.py"
    for line in version_py.read_text().splitlines() if version_py.exists() else []:
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("'\"")
    return "unknown"


def _stats(r: dict[str, Any]) -> dict[str, Any]:
    """What a flashcheck child printed (its last line, JSON); empty for ruff or a failed run."""
    try:
        doc = json.loads(r["stdout_tail"].strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def timed(cmd: list[str], pythonpath: str | None = None) -> dict[str, Any]:
    """Run `cmd` in a fresh child (with `pythonpath` as PYTHONPATH when given); its wall time, CPU time and peak
    RSS (from wait4's rusage)."""
    env = {**os.environ, **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:  # files: a full pipe would block
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read().decode(), err_f.read().decode()
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "exit_status": os.waitstatus_to_exitcode(status),
        "stdout_tail": out[-2000:],
        "stderr_tail": err[-500:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--repeat", type=int, default=2, help="runs per tool (the best one is reported)")
    ap.add_argument("--jobs", type=int, default=0, help="flashcheck's processes (default 0: one per CPU)")
    ap.add_argument("--before", metavar="REV", help="a commit whose verifier runs alongside (no cache)")
    ap.add_argument("--json", default=str(ROOT / "reports" / "raw" / "static_speed.json"))
    ap.add_argument("--md", default=str(ROOT / "reports" / "static-speed.md"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="flashcheck-before-") as before_dir:
        if args.before:
            archive = subprocess.run(["git", "archive", args.before, "src"], cwd=ROOT, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", before_dir], input=archive.stdout, check=True)
        args.before_src = str(Path(before_dir) / "src") if args.before else None
        args.before_label = args.before
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    paths = args.paths or [torch_sources()]
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {**{k: [] for k in _KINDS}, "ruff": []}
    if args.before_src:
        runs["before"] = []
    child = [sys.executable, "-c", _CHILD, str(args.jobs)]
    for _ in range(max(args.repeat, 1)):
        if args.before_src:
            runs["before"].append(timed([sys.executable, "-c", _BEFORE_CHILD, *paths], args.before_src))
        runs["flashcheck"].append(timed([*child, "", *paths]))
        with tempfile.TemporaryDirectory(prefix="flashcheck-static-cache-") as cache:
            runs["flashcheck_cold"].append(timed([*child, cache, *paths]))
            runs["flashcheck_warm"].append(timed([*child, cache, *paths]))
        if ruff:
            ruff_cmd = [ruff, "check", "--select", "E,F", "--no-cache", "--isolated", "--exit-zero", "-q", *paths]
            runs["ruff"].append(timed(ruff_cmd))
    load_after = os.getloadavg()
    best = {k: min(runs[k], key=lambda r: r["cpu_s"]) for k in _KINDS}
    fc = best["flashcheck"]
    stats = _stats(fc) if fc["exit_status"] == 0 else {}
    lines = stats.get("lines", 0)
    per_kind = {k: _stats(r) for k, r in best.items() if r["exit_status"] == 0}

    def rates(r: dict[str, Any]) -> dict[str, Any]:
        out = _stats(r)
        return {
            **{k: r[k] for k in ("wall_s", "cpu_s", "peak_rss_mb", "exit_status")},
            **({"jobs": out["jobs"], "cached_files": out["cached"]} if "jobs" in out else {}),
            "lines_per_s_wall": round(lines / r["wall_s"]) if r["wall_s"] else None,
            "lines_per_s_cpu": round(lines / r["cpu_s"]) if r["cpu_s"] else None,
        }

    ruff_version = subprocess.run([ruff, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "paths": paths,
        "python": platform.python_version(),
        "torch": torch_version(torch_sources()) if not args.paths else None,
        "ruff": ruff_version if ruff else None,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "files": stats.get("files"),
        "lines": lines,
        "hot_path_roots": stats.get("roots"),
        "findings_per_rule": stats.get("findings_per_rule"),
        "same_findings_every_way": len({json.dumps(v.get("findings_per_rule")) for v in per_kind.values()}) == 1
        and len(per_kind) == len(_KINDS),
        "before": rates(min(runs["before"], key=lambda r: r["cpu_s"])) if args.before_src else None,
        "before_label": args.before_label if args.before_src else None,
        "before_findings_per_rule": _stats(min(runs["before"], key=lambda r: r["cpu_s"])).get("findings_per_rule")
        if args.before_src
        else None,
        "internal_errors": stats.get("internal_errors"),
        "jobs": stats.get("jobs"),
        "flashcheck": rates(fc),
        "flashcheck_cold_cache": rates(best["flashcheck_cold"]),
        "flashcheck_warm_cache": rates(best["flashcheck_warm"]),
        "ruff_check_select_E_F": rates(min(runs["ruff"], key=lambda r: r["cpu_s"])) if runs["ruff"] else None,
        "all_runs": {k: [rates(r) for r in v] for k, v in runs.items()},
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    Path(args.md).write_text(render(doc))
    keys = ("lines", "flashcheck", "flashcheck_cold_cache", "flashcheck_warm_cache", "ruff_check_select_E_F")
    print(json.dumps({k: doc[k] for k in keys}, indent=2))
    return 0


def render(doc: dict[str, Any]) -> str:
    fc, rf = doc["flashcheck"], doc["ruff_check_select_E_F"] or {}
    cold, warm = doc["flashcheck_cold_cache"], doc["flashcheck_warm_cache"]
    before = doc.get("before")
    cols = (*((before,) if before else ()), fc, cold, warm, rf)
    rows = [
        (name, *(c.get(key) for c in cols))
        for name, key in (
            ("wall time (s)", "wall_s"),
            ("CPU time, user + system (s)", "cpu_s"),
            ("lines/s by wall time", "lines_per_s_wall"),
            ("lines/s by CPU time", "lines_per_s_cpu"),
            ("peak resident memory (MB)", "peak_rss_mb"),
            ("files loaded from the cache", "cached_files"),
        )
    ]

    def verdict(r: dict[str, Any]) -> str:
        speed = "met" if r["lines_per_s_wall"] >= 150_000 else "not met"
        memory = "met" if r["peak_rss_mb"] <= 500 else "not met"
        return f"{r['lines_per_s_wall']:,} lines/s ({speed}) and {r['peak_rss_mb']} MB ({memory})"

    out = [
        "# `flashcheck static` speed over torch's Python sources, beside `ruff check --select E,F`",
        "",
        "Generated by `benchmarks/static_speed.py` from `reports/raw/static_speed.json`.",
        "",
        f"- **Command:** `{doc['command']}`",
        f"- **Date:** {doc['date']}; Python {doc['python']}, torch {doc['torch']}, {doc['ruff']}",
        f"- **Tree:** {doc['files']} files, {doc['lines']:,} lines; {doc['hot_path_roots']} default hot-path roots",
        f"- **Machine:** {doc['cpus']} CPU cores, shared with other work: load average "
        f"{doc['load_average_before']} before and {doc['load_average_after']} after. Wall times depend on that "
        "load; CPU time does not.",
        f"- **flashcheck:** `--jobs {doc['jobs']}`: one forked process parses every file and holds the model (it "
        "leaves without freeing it); FC101 runs in a process forked from it beside the other rules; with a cache, "
        "further processes pickle and write the new entries (the CPU time of every process is counted). ruff may "
        "use several threads.",
        "",
        "| best run of each | "
        + (f"before ({doc['before_label']}), no cache | " if before else "")
        + "flashcheck static, no cache | cold cache | warm cache | ruff check --select E,F |",
        "|---|---|---|---|---|" + ("---|" if before else ""),
        *["| " + " | ".join(str(v) if v is not None else "" for v in row) + " |" for row in rows],
        "",
        f"Targets: at least 150,000 lines/s by wall time on 2 cores and at most 500 MB; this run: without the "
        f"cache {verdict(fc)}; cold cache {verdict(cold)}; warm cache {verdict(warm)}. `docs/design.md` says where "
        "the time and memory go.",
        "",
        f"Findings per rule: {doc['findings_per_rule']}; the same without, with a cold and with a warm cache: "
        f"{'yes' if doc['same_findings_every_way'] else 'NO'}"
        + (
            f"; the same as before: {'yes' if doc['before_findings_per_rule'] == doc['findings_per_rule'] else 'NO'}"
            if before
            else ""
        )
        + f"; internal errors: {doc['internal_errors']}.",
        "",
        "All runs: "
        + "; ".join(
            f"{_KINDS.get(tool, doc.get('before_label') if tool == 'before' else tool)}: "
            + ", ".join(f"{r['wall_s']} s wall / {r['cpu_s']} s CPU" for r in rs)
            for tool, rs in doc["all_runs"].items()
        ),
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
