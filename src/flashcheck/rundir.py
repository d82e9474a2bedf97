"""The run directory: what the fuzzer, a campaign or a static run leaves behind, and what reports render.

Layout (all JSON, schema `RUN_SCHEMA`)::

    RUN_DIR/run.json        metadata: kind, command, seed, target, started/finished, environment, stats, errors
    RUN_DIR/findings.json   deduplicated findings (findings.save_findings format), rewritten atomically
    RUN_DIR/samples.jsonl   one JSON object per executed step (see `Sample`), appended line by line
    RUN_DIR/repros/SIG.json one reproducer per finding signature

Writers replace `run.json` and `findings.json` atomically, so a killed run never leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import re
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from flashcheck import __version__
from flashcheck._files import RunDirLock
from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding, atomic_write_text, load_findings, save_findings

__all__ = [
    "LAYER_FACTS",
    "RUN_SCHEMA",
    "RunResult",
    "RunWriter",
    "Sample",
    "add_environment",
    "environment",
    "load_run",
    "merge_facts",
]

RUN_SCHEMA = 1


@dataclass(frozen=True)
class Sample:
    """One executed step, for statistics and plots.

    Attributes:
        t: seconds since the run started.
        step: step number within the run (per worker).
        op: ``plan``, ``run``, ``capture``, ``replay``...
        target: target name.
        batch_size: real requests; ``padded``: graph bucket (or the batch size when eager).
        total_qo, total_kv: tokens in the batch.
        workspaces: name -> [used bytes, allocated bytes].
        findings: IDs of findings raised at this step.
        worker: worker index in a campaign.
    """

    t: float
    step: int
    op: str
    target: str
    batch_size: int = 0
    padded: int = 0
    total_qo: int = 0
    total_kv: int = 0
    workspaces: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    findings: tuple[str, ...] = ()
    worker: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["workspaces"] = {k: list(v) for k, v in self.workspaces.items()}
        d["findings"] = list(self.findings)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sample:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        known["workspaces"] = {k: (int(v[0]), int(v[1])) for k, v in dict(known.get("workspaces", {})).items()}
        known["findings"] = tuple(known.get("findings", ()))
        return cls(**known)


@dataclass
class RunResult:
    """Everything a renderer needs: metadata, findings, per-step samples, errors."""

    meta: dict[str, Any]
    findings: list[Finding]
    samples: list[Sample] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return list(self.meta.get("errors", []))

    @property
    def stats(self) -> dict[str, Any]:
        return dict(self.meta.get("stats", {}))


LAYER_FACTS = ("detection layers", "layers skipped")  # environment facts that sessions of one run may differ in


def merge_facts(*facts: Mapping[str, str]) -> dict[str, str]:
    """Facts of several sessions (`LAYER_FACTS`) as one: each distinct value once, in first-seen order, joined with
    `` | `` (a value that is such a join already counts as its parts)."""
    merged: dict[str, list[str]] = {}
    for one in facts:
        for key, joined in one.items():
            values = merged.setdefault(key, [])
            for value in str(joined).split(" | "):
                if value not in values:
                    values.append(value)
    return {key: " | ".join(values) for key, values in merged.items()}


def add_environment(env: dict[str, Any], new: Mapping[str, Any]) -> None:
    """Add one session's environment facts to a run's `env`: the `LAYER_FACTS` of sessions that differ (a worker
    restarted elsewhere) are merged (`merge_facts`), every other fact is the newest."""
    layers = merge_facts(
        {k: str(env[k]) for k in LAYER_FACTS if k in env}, {k: str(new[k]) for k in LAYER_FACTS if k in new}
    )
    env.update({str(k): v for k, v in new.items()})
    env.update(layers)


def environment(*, probe: bool = False) -> dict[str, Any]:
    """Python, platform, and (only if already imported) torch/FlashInfer versions and the device. With `probe`
    (benchmarks), torch and FlashInfer are imported first where installed."""
    if probe:
        for name in ("torch", "flashinfer"):
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    env: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(), "flashcheck": __version__}
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch"] = str(torch.__version__)
        try:
            if torch.cuda.is_available():
                env["device"] = torch.cuda.get_device_name(0)
                env["cuda"] = str(torch.version.cuda)
            else:
                env["device"] = "cpu"
        except Exception as exc:  # a broken CUDA install must not lose the run's metadata
            env["device"] = f"unknown ({exc.__class__.__name__})"
    fi = sys.modules.get("flashinfer")
    if fi is not None:
        env["flashinfer"] = str(getattr(fi, "__version__", "unknown"))
        missing = missing_requirements("flashinfer-python")
        if missing:
            env["flashinfer_missing"] = missing  # declared requirements not installed: a path may behave otherwise
    return env


def missing_requirements(dist: str) -> list[str]:
    """The unconditional requirements of an installed distribution that are not installed (``[]`` when the
    distribution's metadata cannot be read)."""
    from importlib import metadata

    try:
        required = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    out: list[str] = []
    for req in required:
        if ";" in req:  # an extra or a platform marker: not always required
            continue
        name = re.split(r"[\s<>=!~\[(]", req.strip(), maxsplit=1)[0]
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(name)
    return sorted(set(out))


class RunWriter:
    """Writes a run directory incrementally; safe to kill at any point. Holds the directory's lock
    (`flashcheck._files.RunDirLock`) until `close`, unless the caller holds it (`lock=False`). A directory that
    already holds a run is refused unless `resume` (then its findings are kept and new ones added)."""

    def __init__(
        self, run_dir: str | os.PathLike[str], meta: Mapping[str, Any], *, resume: bool = False, lock: bool = True
    ) -> None:
        self.dir = Path(run_dir)
        check_run_dir(self.dir)
        self._lock = RunDirLock(self.dir).acquire() if lock else None
        if not resume and (self.dir / "run.json").exists():
            self._release()
            raise InvalidArgument(f"{self.dir} already holds a run: pass another --out, or --resume to add to it")
        try:
            (self.dir / "repros").mkdir(parents=True, exist_ok=True)
            probe = self.dir / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            self._release()
            raise InvalidArgument(
                f"run directory {self.dir} is not writable ({exc.strerror}); pass another --out"
            ) from None
        self.t0 = time.time()
        self.meta: dict[str, Any] = {"schema": RUN_SCHEMA, "tool": "flashcheck", "version": __version__}
        self.meta.update(meta)
        self.meta.setdefault("started", self.t0)
        self.meta.setdefault("errors", [])
        self._findings: dict[str, Finding] = {}
        if resume and (self.dir / "findings.json").exists():
            for f in load_findings(self.dir / "findings.json"):
                self._findings[f.signature()] = f
        self._samples: TextIO = (self.dir / "samples.jsonl").open("a", encoding="utf-8")
        self.write_meta()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def error(self, message: str) -> None:
        """Record why the run did not complete (the report shows it as incomplete, never clean)."""
        self.meta.setdefault("errors", []).append(message)
        self.write_meta()

    def write_meta(self, **updates: Any) -> None:
        self.meta.update(updates)
        self.meta["environment"] = {**self.meta.get("environment", {}), **environment()}
        atomic_write_text(self.dir / "run.json", json.dumps(self.meta, indent=2, sort_keys=True, default=str) + "\n")

    def add_findings(self, findings: Iterable[Finding]) -> list[Finding]:
        """Add findings (deduplicated by signature); returns the new ones. Rewrites findings.json atomically."""
        new = [f for f in findings if f.signature() not in self._findings]
        for f in new:
            self._findings[f.signature()] = f
        if new:
            save_findings(self.dir / "findings.json", self._findings.values())
        return new

    def add_sample(self, sample: Sample) -> None:
        self._samples.write(json.dumps(sample.to_dict()) + "\n")
        self._samples.flush()

    def write_repro(self, signature: str, repro: Mapping[str, Any]) -> Path:
        path = self.dir / "repros" / f"{signature}.json"
        atomic_write_text(path, json.dumps(repro, indent=2, sort_keys=True, default=str) + "\n")
        return path

    def close(self, *, finished: bool = True, **stats: Any) -> None:
        """Close the run: `finished` False records the stats but not a finish (an interrupted or failed run)."""
        self._samples.close()
        updates: dict[str, Any] = {"stats": {**self.meta.get("stats", {}), **stats}}
        if finished:
            updates["finished"] = time.time()
        self.write_meta(**updates)
        self._release()


def check_run_dir(d: Path) -> None:
    """`InvalidArgument` unless `d` is a directory or can become one (nothing else is ever replaced)."""
    if d.is_symlink() and not d.is_dir():
        raise InvalidArgument(f"run directory {d} is a dangling symbolic link; pass another --out")
    if d.exists() and not d.is_dir():
        raise InvalidArgument(f"run directory {d} is a file, not a directory; pass another --out")


def load_run(run_dir: str | os.PathLike[str]) -> RunResult:
    """Read a run directory; a clear `InvalidArgument` when it is not one."""
    d = Path(run_dir)
    meta_path = d / "run.json"
    if not meta_path.is_file():
        raise InvalidArgument(f"{d} is not a flashcheck run directory (no run.json); pass the --out of a run")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{meta_path} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict) or int(meta.get("schema", 0)) > RUN_SCHEMA:
        raise InvalidArgument(f"{meta_path} has an unknown schema; upgrade flashcheck")
    findings = load_findings(d / "findings.json") if (d / "findings.json").exists() else []
    samples: list[Sample] = []
    sp = d / "samples.jsonl"
    if sp.exists():
        for line in sp.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    samples.append(Sample.from_dict(json.loads(line)))
                except json.JSONDecodeError:
                    continue  # a line cut by a kill: everything before it is intact
    return RunResult(meta=meta, findings=findings, samples=samples)
