"""What mypy's semantic model would cost `flashcheck static`: mypy and flashcheck timed on the same engine-shaped
files (the ``engine_*`` fixture projects, which import torch and flashinfer as real engines do).

For each project: ``mypy --check-untyped-defs`` cold (no cache) and warm (second run on its cache), and
``flashcheck static``, each in a child process with wall time, CPU time and peak memory; plus what mypy knows about
the code (the last line of ``--any-exprs-report``: expressions typed ``Any``, all expressions, the typed share).
mypy reads no configuration file here (``--config-file ""``), as an engine's own setup would differ anyway.
Writes ``reports/raw/mypy_cost.json``.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/mypy_cost.py
"""

from __future__ import annotations

import datetime as dt
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
FIXTURES = ROOT / "tests" / "rules" / "fixtures"


def timed(cmd: list[str], cwd: Path) -> dict[str, Any]:
    with tempfile.TemporaryFile() as out_f:  # a file: a full pipe would block the child
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out_f, stderr=subprocess.STDOUT, env=os.environ.copy())
        _, status, usage = os.wait4(proc.pid, 0)
        out_f.seek(0)
        out = out_f.read().decode()
    return {
        "wall_s": round(time.perf_counter() - t0, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "exit_status": os.waitstatus_to_exitcode(status),
        "output_tail": out[-600:],
    }


def main() -> int:
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent)) or "mypy"
    rows = []
    for project in sorted(p for p in FIXTURES.iterdir() if p.is_dir() and p.name.startswith("engine_")):
        files = [str(f.relative_to(project)) for f in sorted(project.rglob("*.py"))]
        lines = sum(len((project / f).read_text().splitlines()) for f in files)
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as report:
            base = [
                mypy,
                "--check-untyped-defs",
                "--ignore-missing-imports",
                "--namespace-packages",
                "--explicit-package-bases",
                "--cache-dir",
                cache,
            ]
            cold = timed([*base, "--any-exprs-report", report, *files], project)
            warm = timed([*base, *files], project)
            any_report = Path(report, "any-exprs.txt")
            any_exprs = any_report.read_text().splitlines()[-1] if any_report.exists() else ""
        static = timed([sys.executable, "-m", "flashcheck", "static", "."], project)
        rows.append(
            {
                "project": project.name,
                "files": len(files),
                "lines": lines,
                "mypy_cold": cold,
                "mypy_warm": warm,
                "mypy_any_exprs_total": any_exprs.strip(),
                "flashcheck_static": static,
            }
        )
        print(project.name, "mypy cold", cold["cpu_s"], "warm", warm["cpu_s"], "flashcheck", static["cpu_s"])
    doc = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "mypy": subprocess.run([mypy, "--version"], capture_output=True, text=True, check=False).stdout.strip(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "projects": rows,
    }
    out = ROOT / "reports" / "raw" / "mypy_cost.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
