"""Render target-matrix and seed-bug JSON files (from the GPU runs) as the Markdown tables in reports/.

python benchmarks/render_matrix.py reports/raw/matrix-0.6.13.json reports/raw/matrix-0.7.2.json > reports/x.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def render(paths: list[str]) -> str:
    docs = [json.loads(Path(p).read_text()) for p in paths]
    out: list[str] = []
    for p, d in zip(paths, docs, strict=True):
        env = d.get("environment", {})
        out.append(
            f"### `{Path(p).name}`: FlashInfer {env.get('flashinfer')}, torch {env.get('torch')}, {env.get('device')}\n"
        )
        out.append(f"Command: `{d.get('command')}`\n")
        if d["results"] and "property" in d["results"][0]:
            out.append("| seed-bug target | intended property | found | steps to first | s to first | wall s |")
            out.append("|---|---|---|---|---|---|")
            for r in d["results"]:
                out.append(
                    f"| {r['target']} | {r.get('property')} | {r.get('found')} | {r.get('steps_to_first')} | "
                    f"{r.get('seconds_to_first', '')} | {r.get('wall_s')} |"
                )
        else:
            out.append(
                "| target | status | steps (capture/replay/eager) | steps/s | findings | known upstream | rejected |"
            )
            out.append("|---|---|---|---|---|---|---|")
            for r in d["results"]:
                ops = r.get("ops", {})
                opss = f"{r.get('steps', 0)} ({ops.get('capture', 0)}/{ops.get('replay', 0)}/{ops.get('eager', 0)})"
                extra = r.get("reason") or r.get("error") or ""
                out.append(
                    f"| {r['target']} | {r['status']} {extra[:80]} | {opss} | {r.get('steps_per_s', '')} | "
                    f"{r.get('findings') or 'none'} | {r.get('known') or 'none'} | "
                    f"{sum((r.get('rejected') or {}).values())} |"
                )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(sys.argv[1:]))
