"""Durable campaign state in the run directory: findings with their smallest reproducers, samples, counters.

Write order makes a ``kill -9`` at any instant safe: a reproducer is written before the finding that points to
it, findings before the chunk that produced them is marked complete in ``run.json``, and a resumed campaign
re-runs every chunk not marked complete. Re-found findings deduplicate by signature, and samples of incomplete
chunks are dropped on resume (a sample's ``step`` is the worker's running step count), so nothing is lost or
counted twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from flashcheck._files import RunDirLock
from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding, atomic_write_text, load_findings, save_findings
from flashcheck.rundir import RunWriter, Sample, check_run_dir

__all__ = ["CampaignStore", "WorkerState", "load_campaign_meta", "repro_size", "shape_of"]

AddResult = Literal["new", "smaller", "duplicate"]


def repro_size(repro: Mapping[str, Any]) -> tuple[int, int]:
    """(steps, total tokens) of a reproducer's scenario: smaller is better, steps first."""
    steps = repro.get("scenario", {}).get("steps", [])
    return len(steps), sum(sum(s.get("qo_lens", ())) + sum(s.get("kv_lens", ())) for s in steps)


def shape_of(sample: Mapping[str, Any]) -> tuple[str, int, int]:
    """What "distinct shapes covered" counts: (op, real batch size, padded batch size)."""
    return str(sample.get("op", "")), int(sample.get("batch_size", 0)), int(sample.get("padded", 0))


def load_campaign_meta(run_dir: Path) -> dict[str, Any]:
    """run.json of a campaign run directory, validated enough to resume from; `InvalidArgument` otherwise."""
    meta_path = run_dir / "run.json"
    if not run_dir.is_dir():
        raise InvalidArgument(f"--resume {run_dir}: no such directory")
    if not meta_path.is_file():
        raise InvalidArgument(f"--resume {run_dir}: not a run directory (no run.json); pass the --out of a campaign")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"--resume {run_dir}: run.json is unreadable ({exc}); the directory is damaged") from exc
    if not isinstance(meta, dict) or meta.get("kind") != "campaign":
        kind = meta.get("kind") if isinstance(meta, dict) else type(meta).__name__
        raise InvalidArgument(f"--resume {run_dir}: run.json is a {kind!r} run, not a campaign")
    camp = meta.get("campaign")
    if (
        not isinstance(camp, dict)
        or not isinstance(camp.get("config"), dict)
        or not isinstance(camp.get("workers"), dict)
    ):
        raise InvalidArgument(f"--resume {run_dir}: run.json has no campaign state (config and workers)")
    if (run_dir / "findings.json").exists():
        load_findings(run_dir / "findings.json")  # raises InvalidArgument when damaged
    return meta


class WorkerState:
    """Durable counters of one worker slot (its seed stream position survives restarts and resumes)."""

    def __init__(self, d: Mapping[str, Any] | None = None) -> None:
        d = d or {}
        self.next_chunk = int(d.get("next_chunk", 0))
        self.steps_done = int(d.get("steps_done", 0))
        self.crashes = int(d.get("crashes", 0))
        self.restarts = int(d.get("restarts", 0))

    def to_dict(self) -> dict[str, int]:
        return {
            "next_chunk": self.next_chunk,
            "steps_done": self.steps_done,
            "crashes": self.crashes,
            "restarts": self.restarts,
        }


class CampaignStore:
    """Owns RUN_DIR. Use `create` for a new campaign, `resume` for an existing one."""

    def __init__(self, run_dir: Path, meta: dict[str, Any], *, resuming: bool, lock: RunDirLock) -> None:
        self.dir = run_dir
        self.lock = lock  # held from before the directory is read until the process ends
        camp = meta.setdefault("campaign", {})
        self.workers: dict[int, WorkerState] = {int(k): WorkerState(v) for k, v in camp.get("workers", {}).items()}
        self.corpus_done: set[str] = set(camp.get("corpus_done", []))
        self.first_seen: dict[str, dict[str, Any]] = dict(camp.get("first_seen", {}))
        self.dropped: dict[str, str] = dict(camp.get("dropped_targets", {}))
        self.elapsed_before = float(camp.get("elapsed", 0.0))
        self.sessions = int(camp.get("sessions", 0)) + 1
        self.skipped_steps = int(camp.get("skipped_steps", 0))
        self.session_t0 = time.monotonic()
        self.findings: dict[str, Finding] = {}
        self.sizes: dict[str, tuple[int, int]] = {}
        self.shapes: set[tuple[str, int, int]] = set()
        if resuming:
            self._load_findings()
            self._truncate_samples()
            # errors of an earlier session stay on record, but they do not make this session's verdict
            earlier = meta.setdefault("campaign", {}).setdefault("earlier_errors", [])
            earlier.extend(meta.pop("errors", []))
            meta.pop("finished", None)
        for stale in (run_dir / "workers").glob("*/inflight.json"):
            stale.unlink(missing_ok=True)  # an in-flight chunk of a killed session is simply re-run
        self.writer = RunWriter(run_dir, meta, resume=resuming, lock=False)

    # ---- construction ----------------------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: Path, meta: dict[str, Any]) -> CampaignStore:
        check_run_dir(run_dir)
        lock = RunDirLock(run_dir).acquire()
        if (run_dir / "run.json").exists():
            lock.release()
            raise InvalidArgument(
                f"{run_dir} already holds a run; continue it with --resume {run_dir} or pass another --out"
            )
        return cls(run_dir, meta, resuming=False, lock=lock)

    @classmethod
    def resume(cls, run_dir: Path) -> CampaignStore:
        load_campaign_meta(run_dir)  # a clear error for what is not a campaign, before anything is created
        lock = RunDirLock(run_dir).acquire()
        return cls(run_dir, load_campaign_meta(run_dir), resuming=True, lock=lock)  # read again under the lock

    def _load_findings(self) -> None:
        path = self.dir / "findings.json"
        if not path.exists():
            return
        for f in load_findings(path):
            sig = f.signature()
            self.findings[sig] = f
            try:
                repro = json.loads((self.dir / "repros" / f"{sig}.json").read_text(encoding="utf-8"))
                self.sizes[sig] = repro_size(repro)
            except (OSError, json.JSONDecodeError):
                self.sizes[sig] = (1 << 30, 0)  # a lost reproducer: any new occurrence replaces it

    def _truncate_samples(self) -> None:
        """Keep only samples of chunks marked complete (their steps are below the worker's durable count)."""
        path = self.dir / "samples.jsonl"
        if not path.exists():
            return
        kept: list[str] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            ws = self.workers.get(int(d.get("worker", 0)))
            if ws is not None and int(d.get("step", 0)) < ws.steps_done:
                kept.append(line)
                self.shapes.add(shape_of(d))
        atomic_write_text(path, "".join(f"{x}\n" for x in kept))

    # ---- accessors ---------------------------------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        return self.writer.meta

    def worker(self, w: int) -> WorkerState:
        return self.workers.setdefault(w, WorkerState())

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.session_t0

    def steps_done(self) -> int:
        return sum(w.steps_done for w in self.workers.values())

    # ---- writes ------------------------------------------------------------------------------------------------
    def add_finding(self, finding: Finding, repro: dict[str, Any], *, steps: int | None = None) -> AddResult:
        """Record one occurrence: new signature, or a smaller reproducer of a known one, or a duplicate. `steps`:
        the campaign-wide count of steps run when it was seen (completed chunks and the steps of chunks in flight);
        default: the completed chunks only."""
        sig = finding.signature()
        size = repro_size(repro)
        if sig in self.findings and size >= self.sizes[sig]:
            return "duplicate"
        result: AddResult = "smaller" if sig in self.findings else "new"
        rel = f"repros/{sig}.json"
        finding = finding.with_repro(rel)
        repro = {**repro, "finding": finding.to_dict()}
        self.writer.write_repro(sig, repro)  # the reproducer first: findings.json never points to a missing file
        self.findings[sig] = finding
        self.sizes[sig] = size
        save_findings(self.dir / "findings.json", self.findings.values())
        if result == "new" and sig not in self.first_seen:
            self.first_seen[sig] = {
                "id": finding.id,
                "target": finding.location.target,
                "elapsed": round(self.elapsed(), 3),
                "steps": self.steps_done() if steps is None else steps,
            }
            # on record at once: a session killed before its next save would resume with the finding but not when
            # it was first seen (a resumed run re-finds it as a duplicate and never records it again)
            self.save()
        return result

    def add_sample(self, sample: Sample) -> None:
        self.writer.add_sample(sample)
        self.shapes.add((sample.op, sample.batch_size, sample.padded))

    def save(self, **extra: Any) -> None:
        """Rewrite run.json atomically with every counter (call after each completed chunk)."""
        camp = self.meta["campaign"]
        camp.update(
            workers={str(k): v.to_dict() for k, v in sorted(self.workers.items())},
            corpus_done=sorted(self.corpus_done),
            first_seen=self.first_seen,
            dropped_targets=self.dropped,
            elapsed=round(self.elapsed(), 3),
            sessions=self.sessions,
            skipped_steps=self.skipped_steps,
        )
        camp.update(extra)
        steps = self.steps_done()
        by_id: dict[str, int] = {}
        for f in self.findings.values():
            by_id[f.id] = by_id.get(f.id, 0) + 1
        el = self.elapsed()
        self.writer.write_meta(
            stats={
                "steps": steps,
                "elapsed_s": round(el, 3),
                "steps_per_s": round(steps / el, 3) if el > 0 else 0.0,
                "findings": len(self.findings),
                "findings_by_id": by_id,
                "crashes": sum(w.crashes for w in self.workers.values()),
                "restarts": sum(w.restarts for w in self.workers.values()),
            }
        )

    def error(self, message: str) -> None:
        self.meta.setdefault("errors", []).append(message)

    def close(self, **extra: Any) -> None:
        self.save(**extra)
        self.writer.close()
        self.lock.release()
