"""Campaign options: time budgets, worker counts, node sharding (SLURM / Kubernetes) and the per-chunk seeds.

Everything here is pure (no torch, no processes) so the CLI can validate input before anything starts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from flashcheck.errors import InvalidArgument
from flashcheck.pressure import parse_pressure_us

__all__ = ["CampaignConfig", "chunk_seed", "count_gpus", "parse_duration", "parse_workers", "resolve_node"]

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")


def parse_duration(text: str, flag: str = "--time") -> float:
    """``90s``, ``10m``, ``8h``, ``1h30m``, ``2h15m10s`` (or plain seconds, ``300``) -> seconds; errors name
    `flag`."""
    s = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        seconds = float(s)
    else:
        parts = _DURATION_RE.findall(s)
        units = [u for _, u in parts]
        if (
            not parts
            or "".join(f"{n}{u}" for n, u in parts) != s
            or len(set(units)) != len(units)
            or units != sorted(units, key="hms".index)
        ):
            raise InvalidArgument(
                f"{flag} {text!r} does not parse; write it like 90s, 10m, 8h or 1h30m (hours, minutes, "
                "seconds, in that order)"
            )
        seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise InvalidArgument(f"{flag} {text!r} must be positive")
    return seconds


def format_duration(seconds: float) -> str:
    s = int(max(0.0, seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def count_gpus(env: Mapping[str, str] | None = None) -> int:
    """Visible CUDA devices without importing torch: CUDA_VISIBLE_DEVICES if set, else ``nvidia-smi -L``."""
    env = os.environ if env is None else env
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([d for d in vis.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def visible_gpu_ids(env: Mapping[str, str] | None = None) -> list[str]:
    """The device ids a worker may be pinned to (the entries of CUDA_VISIBLE_DEVICES when it is set)."""
    env = os.environ if env is None else env
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return [d.strip() for d in vis.split(",") if d.strip() and d.strip() != "-1"]
    return [str(i) for i in range(count_gpus(env))]


def parse_workers(text: str, gpus: int) -> int:
    """``auto`` -> one per visible GPU (1 on CPU); ``N`` -> N."""
    if str(text).strip().lower() == "auto":
        return max(1, gpus)
    try:
        n = int(text)
    except ValueError:
        raise InvalidArgument(f"--workers must be 'auto' or a positive integer, got {text!r}") from None
    if n < 1:
        raise InvalidArgument(f"--workers must be >= 1, got {n}")
    return n


def resolve_node(index: int | None, count: int | None, env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """This node's (index, count) in a multi-node campaign.

    Flags win; otherwise ``FLASHCHECK_NODE_INDEX``/``FLASHCHECK_NUM_NODES``, a SLURM array
    (``SLURM_ARRAY_TASK_ID`` minus ``SLURM_ARRAY_TASK_MIN``, ``SLURM_ARRAY_TASK_COUNT``) or a Kubernetes indexed
    job (``JOB_COMPLETION_INDEX``; the count from the flag or ``FLASHCHECK_NUM_NODES``). Default: node 0 of 1.
    """
    env = os.environ if env is None else env

    def _int(name: str) -> int | None:
        v = env.get(name)
        if v is None or v == "":
            return None
        try:
            return int(v)
        except ValueError:
            raise InvalidArgument(f"environment variable {name}={v!r} is not an integer") from None

    idx, cnt = index, count
    if idx is None:
        idx = _int("FLASHCHECK_NODE_INDEX")
    if idx is None and _int("SLURM_ARRAY_TASK_ID") is not None:
        idx = int(_int("SLURM_ARRAY_TASK_ID") or 0) - int(_int("SLURM_ARRAY_TASK_MIN") or 0)
        cnt = cnt if cnt is not None else _int("SLURM_ARRAY_TASK_COUNT")
    if idx is None:
        idx = _int("JOB_COMPLETION_INDEX")
    if cnt is None:
        cnt = _int("FLASHCHECK_NUM_NODES")
    idx = 0 if idx is None else idx
    cnt = max(1, idx + 1) if cnt is None else cnt
    if cnt < 1 or not 0 <= idx < cnt:
        raise InvalidArgument(f"node index {idx} is not in [0, {cnt}); check --node-index/--num-nodes")
    return idx, cnt


def chunk_seed(seed: int, node: int, worker: int, chunk: int) -> int:
    """The seed of one chunk: independent streams per (campaign seed, node, worker) via numpy's SeedSequence."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, node, worker, chunk]).generate_state(2)
    return (int(state[0]) << 31) ^ int(state[1])


@dataclass(frozen=True)
class CampaignConfig:
    """What a campaign was started with; stored in run.json so `--resume` continues with the same settings.

    Attributes:
        targets: target specs (built-in names or ``module:Class``); chunks rotate over them.
        target_config: overrides passed to every target's constructor.
        seed: the campaign seed (every chunk seed derives from it, the node and the worker).
        workers: worker processes on this node.
        time_budget: seconds of campaign time (all sessions together), or None.
        step_budget: steps (all workers of this node together), or None.
        chunk_steps: steps per scenario chunk (one fresh session each; the unit of durability).
        layers: runtime detection layers.
        device: ``auto``, ``cpu`` or ``cuda``.
        step_timeout: seconds without progress after which a busy worker counts as hung.
        warm_up_scale: the first eager and capture step (and a first replay before any capture) of each worker
            process may take this many step timeouts (lazy imports and first-use JIT compiles); 1 where the kernels
            are compiled ahead of time.
        node_index, num_nodes: this node's place in a multi-node campaign.
        gpus: device ids workers are pinned to (round-robin); empty on CPU.
        select: check IDs to report (empty: all). FC251 is always reported.
        ledger: path of the quarantine ledger, or None.
        corpus: the corpus location (a directory or ``redis://``), or None for RUN_DIR/corpus.
        async_pressure_us: ``--async-pressure-us``: device-side delay before each host-side preparation step of
            every worker (None: off).
    """

    targets: tuple[str, ...]
    seed: int = 0
    workers: int = 1
    time_budget: float | None = None
    step_budget: int | None = None
    chunk_steps: int = 50
    layers: str = "all"
    device: str = "auto"
    step_timeout: float = 600.0
    warm_up_scale: float = 5.0
    node_index: int = 0
    num_nodes: int = 1
    gpus: tuple[str, ...] = ()
    select: tuple[str, ...] = ()
    ledger: str | None = None
    corpus: str | None = None
    target_config: Mapping[str, Any] = field(default_factory=dict)
    async_pressure_us: float | None = None

    def __post_init__(self) -> None:
        if not self.targets:
            raise InvalidArgument("a campaign needs at least one target")
        if self.chunk_steps < 1:
            raise InvalidArgument(f"--chunk-steps must be >= 1, got {self.chunk_steps}")
        if self.step_budget is not None and self.step_budget < 1:
            raise InvalidArgument(f"--steps must be >= 1, got {self.step_budget}")
        if self.step_timeout <= 0:
            raise InvalidArgument(f"--step-timeout must be positive, got {self.step_timeout}")
        if not self.warm_up_scale >= 1:
            raise InvalidArgument(f"--warm-up-scale must be at least 1, got {self.warm_up_scale}")
        if self.layers not in ("off", "cheap", "all", "races"):
            raise InvalidArgument(f"--layers must be off, cheap, all or races, got {self.layers!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise InvalidArgument(f"--device must be auto, cpu or cuda, got {self.device!r}")
        object.__setattr__(self, "async_pressure_us", parse_pressure_us(self.async_pressure_us))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target_config"] = dict(self.target_config)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CampaignConfig:
        try:
            known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
            for k in ("targets", "gpus", "select"):
                if k in known:
                    known[k] = tuple(known[k])
            return cls(**known)
        except (TypeError, KeyError) as exc:
            raise InvalidArgument(f"malformed campaign configuration {dict(d)!r:.200}: {exc}") from exc
