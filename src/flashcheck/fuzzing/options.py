"""Budgets, profiles and the options a pytest run (or the CLI) hands to every fuzz test.

Profiles: ``ci`` (fast: few short examples), ``gpu`` (no deadline, since FlashInfer kernels JIT-compile on first use;
more and longer examples), ``nightly`` (long campaigns). ``auto`` picks ``gpu`` when CUDA is available, else ``ci``.
A budget is a number of examples (``200``) or a time (``30s``, ``5m``, ``1h``). Nothing here imports torch.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

from flashcheck.errors import InvalidArgument

__all__ = [
    "PROFILES",
    "PROFILE_NAMES",
    "Budget",
    "FuzzOptions",
    "ProfileName",
    "ProfileSpec",
    "active_options",
    "cuda_unavailable_reason",
    "current_test",
    "parse_budget",
    "resolve_profile",
    "set_active_options",
    "set_current_test",
]

ProfileName = Literal["ci", "gpu", "nightly", "auto"]
PROFILE_NAMES: tuple[str, ...] = get_args(ProfileName)


@dataclass(frozen=True)
class ProfileSpec:
    """Hypothesis settings of one profile: examples per test, steps per replay sequence, deadline (ms or None)."""

    examples: int
    step_count: int
    deadline_ms: float | None


PROFILES: dict[str, ProfileSpec] = {
    "ci": ProfileSpec(examples=20, step_count=10, deadline_ms=None),
    "gpu": ProfileSpec(examples=200, step_count=30, deadline_ms=None),
    "nightly": ProfileSpec(examples=5000, step_count=50, deadline_ms=None),
}


@dataclass(frozen=True)
class Budget:
    """How long one fuzz test runs: `examples` Hypothesis examples, or `seconds` of wall time (whichever is set)."""

    examples: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.examples is None) == (self.seconds is None):
            raise InvalidArgument("a budget is either a number of examples or a time, not both or neither")
        if self.examples is not None and self.examples < 1:
            raise InvalidArgument(f"a budget needs >= 1 example, got {self.examples}")
        if self.seconds is not None and self.seconds <= 0:
            raise InvalidArgument(f"a time budget must be > 0 seconds, got {self.seconds}")

    def __str__(self) -> str:
        return f"{self.examples} examples" if self.examples is not None else f"{self.seconds:g}s"


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_budget(value: str | int | float | Budget) -> Budget:
    """``200`` -> 200 examples; ``"30s"``, ``"5m"``, ``"1.5h"`` or a float -> seconds."""
    if isinstance(value, Budget):
        return value
    if isinstance(value, bool):
        raise InvalidArgument(f"budget must be a number of examples or a time like '30s', got {value!r}")
    if isinstance(value, int):
        return Budget(examples=value)
    if isinstance(value, float):
        return Budget(seconds=value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(value))
    if not m:
        raise InvalidArgument(f"budget {value!r} is neither a number of examples (200) nor a time (30s, 5m, 1h)")
    num, unit = m.groups()
    if not unit:
        if "." in num:
            raise InvalidArgument(f"budget {value!r}: a number of examples must be an integer (or add s/m/h)")
        return Budget(examples=int(num))
    return Budget(seconds=float(num) * _UNITS[unit])


def resolve_profile(name: str | None) -> str:
    """The concrete profile: ``auto``/None becomes ``gpu`` with CUDA, else ``ci`` (imports torch only then)."""
    if name in (None, "auto"):
        return "ci" if cuda_unavailable_reason() else "gpu"
    if name not in PROFILES:
        raise InvalidArgument(f"unknown profile {name!r}; choose one of {', '.join(PROFILE_NAMES)}")
    return name


@functools.cache
def cuda_unavailable_reason() -> str | None:
    """None when a CUDA device is usable, else why not (imports torch on first call)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'flashcheck[torch]')"
    if not torch.cuda.is_available():
        return "no CUDA device: gpu tests run on GPU nodes (reports/ holds their evidence)"
    return None


@dataclass(frozen=True)
class FuzzOptions:
    """What the pytest plugin (or the CLI) sets for every fuzz test of the run.

    Attributes:
        target: ``--flashcheck-target`` (a built-in name or ``module:Class``), or None for each test's own.
        budget: ``--flashcheck-budget``; overrides a test's own budget when set.
        seed: the run's seed (printed in the header); each test derives its Hypothesis seed from it.
        profile: ``ci``, ``gpu``, ``nightly`` or ``auto``.
        out_dir: where reproducers are written.
        async_pressure_us: ``--async-pressure-us``: device-side delay before each host-side preparation step
            (None: off).
    """

    target: str | None = None
    budget: Budget | None = None
    seed: int | None = None
    profile: str = "auto"
    out_dir: Path | None = None
    async_pressure_us: float | None = None

    def with_(self, **changes: object) -> FuzzOptions:
        return replace(self, **changes)  # type: ignore[arg-type]


_ACTIVE = FuzzOptions()
_CURRENT_TEST: list[str | None] = [None]


def active_options() -> FuzzOptions:
    """The options of the current run (defaults outside pytest)."""
    return _ACTIVE


def set_active_options(options: FuzzOptions) -> FuzzOptions:
    """Install `options` for the run; returns the previous ones (so a caller can restore them)."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, options
    return previous


def set_current_test(nodeid: str | None) -> None:
    """The test now running (the pytest plugin sets it; findings are attributed to it)."""
    _CURRENT_TEST[0] = nodeid


def current_test() -> str | None:
    return _CURRENT_TEST[0]
