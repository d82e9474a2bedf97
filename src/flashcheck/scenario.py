"""The scenario model: a `Step`, a `Scenario` (a reproducible sequence of steps, as JSON) and a `StepResult`.

A `Scenario` names the target, its configuration, the seed and the steps (``eager``, ``capture``, ``replay``). The
driver that runs them is `flashcheck.driver.Driver`; this module imports neither it nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding
from flashcheck.rundir import Sample

__all__ = ["Scenario", "Step", "StepOp", "StepResult"]

StepOp = Literal["eager", "capture", "replay"]
_OPS: tuple[str, ...] = get_args(StepOp)


@dataclass(frozen=True)
class Step:
    """One step: an eager batch, a graph capture for a bucket, or a replay of a real batch through its bucket."""

    op: StepOp
    qo_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    bucket: int | None = None
    seed: int = 0
    allocator: str = "shuffled"

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise InvalidArgument(f"step op {self.op!r} is not one of {', '.join(_OPS)}")
        object.__setattr__(self, "qo_lens", tuple(int(x) for x in self.qo_lens))
        object.__setattr__(self, "kv_lens", tuple(int(x) for x in self.kv_lens))

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "qo_lens": list(self.qo_lens),
            "kv_lens": list(self.kv_lens),
            "bucket": self.bucket,
            "seed": self.seed,
            "allocator": self.allocator,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Step:
        try:
            return cls(
                op=d["op"],
                qo_lens=tuple(d["qo_lens"]),
                kv_lens=tuple(d["kv_lens"]),
                bucket=d.get("bucket"),
                seed=int(d.get("seed", 0)),
                allocator=str(d.get("allocator", "shuffled")),
            )
        except (KeyError, TypeError) as exc:
            raise InvalidArgument(f"malformed scenario step {dict(d)!r:.200}: {exc!r}") from exc


@dataclass(frozen=True)
class Scenario:
    """A reproducible sequence of steps against one target configuration."""

    target: str
    steps: tuple[Step, ...]
    seed: int = 0
    target_config: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "target_config": dict(self.target_config),
            "seed": self.seed,
            "steps": [s.to_dict() for s in self.steps],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Scenario:
        if not isinstance(d, Mapping) or "target" not in d or "steps" not in d:
            raise InvalidArgument("a scenario is a JSON object with 'target' and 'steps'")
        return cls(
            target=str(d["target"]),
            steps=tuple(Step.from_dict(s) for s in d["steps"]),
            seed=int(d.get("seed", 0)),
            target_config=dict(d.get("target_config", {})),
        )


@dataclass
class StepResult:
    """What one step produced: its findings, its sample (None when it did not run), and why it was skipped when the
    target's declared input contract excludes it."""

    findings: list[Finding]
    sample: Sample | None
    rejected: str | None = None
