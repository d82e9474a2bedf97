"""Speed of ``flashcheck static`` over a large tree (default: the installed torch package's Python sources).

Prints files, lines, wall time, lines per second, hot-path roots and findings per rule, and optionally writes them
as JSON. It never imports torch: the package is located with ``importlib.util.find_spec``. Timed assertions do not
belong in tests; this script only measures.

    python benchmarks/static_speed.py [PATH ...] [--repeat N] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

from flashcheck.verifier import StaticConfig, check_paths


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--repeat", type=int, default=1, help="runs to time (the best one is reported)")
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args()
    paths = args.paths or [torch_sources()]
    root = paths[0] if Path(paths[0]).is_dir() else str(Path(paths[0]).parent)
    best = None
    for _ in range(max(args.repeat, 1)):
        t0 = time.perf_counter()
        result = check_paths(paths, StaticConfig(root=root))
        wall = time.perf_counter() - t0
        if best is None or wall < best[0]:
            best = (wall, result)
    assert best is not None
    wall, result = best
    per_rule = dict(sorted(Counter(f.id for f in result.findings).items()))
    doc = {
        "paths": paths,
        "files": len(result.files),
        "lines": result.lines,
        "seconds": round(wall, 2),
        "lines_per_second": round(result.lines / wall),
        "hot_path_roots": result.roots,
        "findings": len(result.findings),
        "findings_per_rule": per_rule,
        "internal_errors": len(result.internal_errors),
        "python": platform.python_version(),
        "torch": torch_version(torch_sources()) if not args.paths else None,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    for k, v in doc.items():
        print(f"{k:>18}: {v}")
    for err in result.internal_errors:
        print(f"internal error: {err}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
