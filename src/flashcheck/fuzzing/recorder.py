"""Where fuzz findings go: one JSON reproducer per finding signature, and a log the pytest plugin summarizes.

While Hypothesis shrinks, every failing example rewrites the reproducer of its signature, so the file left behind is
the one of the last (smallest) failing example Hypothesis re-runs to report.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashcheck.findings import Finding
from flashcheck.fuzzing.options import active_options, current_test
from flashcheck.repro import make_repro, pytest_snippet, save_repro
from flashcheck.scenario import Scenario

__all__ = ["FindingLog", "Recorded", "default_log", "describe"]


@dataclass
class Recorded:
    """One finding as recorded: the finding (with its repro path), the reproducer document and the test."""

    finding: Finding
    repro: dict[str, Any]
    path: Path | None
    test: str | None = None
    seed: int | None = None


class FindingLog:
    """Saves reproducers under `out_dir` (``SIG.json``) and keeps the latest record per signature."""

    def __init__(self, out_dir: str | Path | None = None) -> None:
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.entries: dict[str, Recorded] = {}
        self._tmp: Path | None = None

    def directory(self) -> Path:
        """`out_dir`, else the run's ``--flashcheck-out`` (or pytest cache dir), else a fresh temporary directory."""
        d = self.out_dir or active_options().out_dir
        if d is None:
            if self._tmp is None:
                self._tmp = Path(tempfile.mkdtemp(prefix="flashcheck-repros-"))
            d = self._tmp
        d.mkdir(parents=True, exist_ok=True)
        return d

    def record(
        self,
        scenario: Scenario,
        step: int,
        findings: Sequence[Finding],
        *,
        layers: str = "all",
        seed: int | None = None,
        async_pressure_us: float | None = None,
    ) -> list[Recorded]:
        """Write one reproducer per finding (signature-named, overwritten by later = smaller examples)."""
        out: list[Recorded] = []
        for f in findings:
            sig = f.signature()
            path = self.directory() / f"{sig}.json"
            repro = make_repro(scenario, step, f, layers=layers, async_pressure_us=async_pressure_us)
            if seed is not None:
                repro["hypothesis_seed"] = seed
            repro["command"] = f"flashcheck replay {path}"
            save_repro(path, repro)
            rec = Recorded(f.with_repro(str(path)), repro, path, current_test(), seed)
            self.entries[sig] = rec
            out.append(rec)
        return out

    def clear(self) -> None:
        self.entries.clear()


def describe(records: Sequence[Recorded], *, snippet: bool = True) -> str:
    """Human-readable lines: each finding, how to replay it, and (first one) a pytest snippet."""
    lines: list[str] = []
    for r in records:
        lines.append(str(r.finding))
        if r.path is not None:
            lines.append(f"    reproducer: {r.path}")
            lines.append(f"    replay:     flashcheck replay {r.path}")
    if snippet and records and records[0].path is not None:
        lines.append("")
        lines.append("paste into a test to keep it fixed:")
        lines.append(pytest_snippet(records[0].repro, str(records[0].path)))
    return "\n".join(lines)


_DEFAULT = FindingLog()


def default_log() -> FindingLog:
    """The process-wide log (the pytest plugin points it at its output directory and reads it at the end)."""
    return _DEFAULT
