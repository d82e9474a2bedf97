"""The live progress display (redrawn in place on a terminal, plain log lines otherwise) and the end summary.

`final_report(run_dir)` is the hook where the report renderers of ``flashcheck report`` plug in; until they land
it renders the compact summary below from the run directory alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from flashcheck.campaign.options import format_duration
from flashcheck.findings import atomic_write_text, load_findings

__all__ = ["Progress", "Snapshot", "WorkerLine", "final_report", "summarize"]


@dataclass
class WorkerLine:
    index: int
    status: str
    steps: int
    rate: float
    target: str = ""


@dataclass
class Snapshot:
    elapsed: float
    remaining: str
    steps: int
    workers: Sequence[WorkerLine]
    findings_by_id: Mapping[str, int]
    shapes: int
    crashes: int
    restarts: int
    corpus: int
    notes: list[str] = field(default_factory=list)


class Progress:
    """Renders snapshots: a block redrawn in place on a TTY, one log line every `log_every` seconds otherwise."""

    def __init__(self, stream: TextIO, *, tty: bool | None = None, log_every: float = 30.0) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.log_every = log_every
        self._drawn = 0
        self._last = 0.0

    def note(self, text: str) -> None:
        """An event worth a line of its own (new finding, crash, restart): printed above the live block."""
        self._clear()
        self.stream.write(f"[campaign] {text}\n")
        self.stream.flush()

    def update(self, snap: Snapshot, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            if not force and now - self._last < 0.5:
                return
            self._clear()
            lines = self._block(snap)
            self.stream.write("\n".join(lines) + "\n")
            self._drawn = len(lines)
        else:
            if not force and now - self._last < self.log_every:
                return
            self.stream.write(f"[campaign] {self._line(snap)}\n")
        self._last = now
        self.stream.flush()

    def _clear(self) -> None:
        if self.tty and self._drawn:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0

    @staticmethod
    def _findings(snap: Snapshot) -> str:
        return ", ".join(f"{k}×{v}" for k, v in sorted(snap.findings_by_id.items())) or "none"

    def _line(self, snap: Snapshot) -> str:
        rates = " ".join(f"w{w.index}={w.rate:.1f}/s({w.status})" for w in snap.workers)
        return (
            f"elapsed {format_duration(snap.elapsed)} remaining {snap.remaining} | steps {snap.steps} | {rates} | "
            f"findings {self._findings(snap)} | shapes {snap.shapes} | crashes {snap.crashes} "
            f"restarts {snap.restarts} | corpus {snap.corpus}"
        )

    def _block(self, snap: Snapshot) -> list[str]:
        lines = [
            f"flashcheck campaign  elapsed {format_duration(snap.elapsed)}  remaining {snap.remaining}  "
            f"steps {snap.steps}  shapes {snap.shapes}  corpus {snap.corpus}"
        ]
        lines += [
            f"  worker {w.index:<3} {w.status:<9} {w.steps:>8} steps {w.rate:>7.1f} steps/s  {w.target}"
            for w in snap.workers
        ]
        lines.append(f"  findings: {self._findings(snap)}   crashes {snap.crashes}   restarts {snap.restarts}")
        return lines


def summarize(run_dir: str | Path) -> str:
    """A compact Markdown summary of a campaign run directory (steps, rate, findings, time to first finding)."""
    d = Path(run_dir)
    meta = json.loads((d / "run.json").read_text(encoding="utf-8"))
    camp: dict[str, Any] = meta.get("campaign", {})
    stats: dict[str, Any] = meta.get("stats", {})
    cfg = camp.get("config", {})
    findings = load_findings(d / "findings.json") if (d / "findings.json").exists() else []
    first = camp.get("first_seen", {})
    env = meta.get("environment", {})
    out = [
        f"# flashcheck campaign: {', '.join(cfg.get('targets', []))}",
        "",
        f"- command: `{meta.get('command', '')}`",
        f"- seed {cfg.get('seed')}, node {cfg.get('node_index', 0)}/{cfg.get('num_nodes', 1)}, "
        f"{cfg.get('workers')} worker(s), layers {cfg.get('layers')}, sessions {camp.get('sessions', 1)}",
        f"- device: {env.get('device', 'n/a')}; torch {env.get('torch', 'n/a')}; "
        f"flashinfer {env.get('flashinfer', 'n/a')}; python {env.get('python', '')}",
        f"- steps {stats.get('steps', 0)} in {format_duration(float(stats.get('elapsed_s', 0)))} "
        f"({stats.get('steps_per_s', 0)} steps/s); crashes {stats.get('crashes', 0)}, restarts "
        f"{stats.get('restarts', 0)}, quarantined steps {camp.get('skipped_steps', 0)}",
    ]
    specs, names = str(meta.get("target") or "").split(","), meta.get("targets") or []
    for t, why in camp.get("dropped_targets", {}).items():
        name = names[specs.index(t)] if t in specs and len(names) == len(specs) else t
        out.append(f"- target {name if name == t else f'{name} ({t})'} unavailable here: {why}")
    for e in meta.get("errors", []):
        out.append(f"- error: {str(e).splitlines()[0] if str(e) else e}")
    known = meta.get("known_upstream") or {}
    if known:
        out.append(
            "- known upstream behaviours (flashcheck.known): " + ", ".join(f"{k} x{n}" for k, n in known.items())
        )
    for key, why in (meta.get("known_unmatched") or {}).items():
        out.append(f"- known-behaviour entry {key} matched nothing in this run (did the upstream code change?): {why}")
    out += ["", f"## Findings ({len(findings)})", ""]
    if findings:
        out += ["| id | name | target | first seen | where | reproducer |", "|---|---|---|---|---|---|"]
        for f in sorted(findings, key=lambda f: first.get(f.signature(), {}).get("elapsed", 0.0)):
            fs = first.get(f.signature(), {})
            when = f"{fs['elapsed']:.1f}s, step {fs['steps']}" if fs else "?"
            msg = f.message.replace("|", "/")[:90]
            out.append(f"| {f.id} | {f.name} | {f.location.target or ''} | {when} | {msg} | {f.repro or ''} |")
    else:
        out.append("none")
    return "\n".join(out) + "\n"


def final_report(run_dir: str | Path) -> str:
    """End-of-campaign report: RUN_DIR/summary.md (compact) and RUN_DIR/report.html (``flashcheck report``'s
    self-contained HTML); returns the summary with the path of the HTML report."""
    from flashcheck.reports import render
    from flashcheck.rundir import load_run

    text = summarize(run_dir)
    atomic_write_text(Path(run_dir) / "summary.md", text)
    html = Path(run_dir) / "report.html"
    atomic_write_text(html, render(load_run(run_dir), "html", run_dir=run_dir))
    return f"{text}\nHTML report: {html} (other formats: flashcheck report {run_dir} --format sarif|junit|...)\n"
