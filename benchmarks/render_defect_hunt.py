"""Render the defect-hunt raw JSON of one or more FlashInfer versions into reports/defect-hunt.md.

python benchmarks/render_defect_hunt.py reports/raw/defect_hunt-*.json --out reports/defect-hunt.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

VERDICT = {
    "found": "**found**",
    "finished": "not found",
    "crashed": "**found** (the process died)",
    "error": "hunt error",
    "timeout": "not found (share spent inside one trial or a kernel compile)",
    "running": "not found (stopped)",
    "no result": "no result",
}


def _cell(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "not run"
    verdict = VERDICT.get(str(rec.get("status")), str(rec.get("status")))
    return f"{verdict}: {rec.get('trials', 0)} trials in {rec.get('wall_s', '?')} s"


def render(docs: list[dict[str, Any]]) -> str:
    docs = sorted(docs, key=lambda d: str(d.get("flashinfer")))
    versions = [str(d.get("flashinfer")) for d in docs]
    names: list[str] = []
    for d in docs:
        names += [c["class"] for c in d["classes"] if c["class"] not in names]
    by = {(str(d.get("flashinfer")), c["class"]): c for d in docs for c in d["classes"]}
    by_dir = {str(d.get("flashinfer")): d.get("_dir", ".") for d in docs}
    out = [
        "# FlashInfer defect hunt",
        "",
        "Generators aimed at FlashInfer behaviours that serving engines trip over, each run for a fixed share of a "
        "time budget on one GPU per FlashInfer version (`benchmarks/defect_hunt.py`). *Found* means an input was "
        "seen that produces a wrong output, writes past the batch, is not reproducible bit for bit in deterministic "
        "mode, is accepted although malformed, or kills the process; its minimized reproducer is below.",
        "",
    ]
    for d in docs:
        out.append(
            f"- FlashInfer {d.get('flashinfer')}, torch {d.get('torch')}, {d.get('device')}, {d.get('date')}, "
            f"budget {d.get('budget_s')} s, seed {d.get('seed')}: `{d.get('command')}`"
        )
    out += ["", "| class | " + " | ".join(versions) + " |", "|---|" + "---|" * len(versions)]
    for n in names:
        out.append(f"| {n} | " + " | ".join(_cell(by.get((v, n))) for v in versions) + " |")
    for n in names:
        out += ["", f"## {n}", ""]
        first = next((by[(v, n)] for v in versions if (v, n) in by), {})
        out += [f"What was tried: {first.get('describes', '')}.", ""]
        for v in versions:
            rec = by.get((v, n))
            if rec is None:
                continue
            outcomes = ", ".join(f"{k}: {c}" for k, c in sorted(rec.get("outcomes", {}).items())) or "none"
            out.append(f"- **{v}**: {_cell(rec)}; outcomes {outcomes}.")
            if rec.get("error"):
                out.append(f"  Hunt error: `{rec['error']}`.")
            repro = rec.get("reproducer") or (rec.get("in_flight") if rec.get("status") == "crashed" else None)
            if repro:
                shown = repro.get("minimized", repro.get("params", repro)) if isinstance(repro, dict) else repro
                out += ["", "  ```json", "  " + json.dumps(shown, default=str)[:1500], "  ```"]
                extra = {k: w for k, w in repro.items() if k not in ("params", "minimized")}
                if extra:
                    out.append(f"  Observed: `{json.dumps(extra, default=str)[:800]}`")
            if rec.get("repro_file"):
                where = Path(str(by_dir.get(v, "."))) / str(rec["repro_file"])
                out.append(f"  Reproducer: `flashcheck replay {where.as_posix()}`.")
            for note in rec.get("notes", []):
                out.append(f"  {note}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("raw", nargs="+", type=Path, help="defect_hunt-<version>.json files")
    p.add_argument("--out", type=Path, default=Path("reports/defect-hunt.md"))
    args = p.parse_args(argv)
    docs = [{**json.loads(f.read_text()), "_dir": f.parent.as_posix()} for f in args.raw]
    args.out.write_text(render(docs))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
