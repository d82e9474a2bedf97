"""The fuzz sessions of this process: what a replay machine runs against (`MachineConfig`), and one open session
per configuration, reused by every example and closed at exit."""

from __future__ import annotations

import atexit
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from flashcheck.driver import Driver
from flashcheck.exercised import Exercised, merge_by_target
from flashcheck.fuzzing.distributions import DISTRIBUTIONS
from flashcheck.fuzzing.recorder import FindingLog
from flashcheck.fuzzing.strategies import EDGE_CASES
from flashcheck.isolation import IsolatedDriver
from flashcheck.rundir import merge_facts
from flashcheck.scenario import Step, StepResult
from flashcheck.session import Layers, open_session
from flashcheck.targets.protocol import Target
from flashcheck.targets.registry import target_spec
from flashcheck.watchdog import default_step_timeout

__all__ = ["SESSIONS", "SHRINK_SECONDS", "MachineConfig", "Reset", "StepCheck"]

Reset = Literal["capture", "session"]
StepCheck = Callable[[Step, StepResult], None]
SHRINK_SECONDS = 60.0  # default shrink time of one failure (`MachineConfig.shrink_seconds`)


@dataclass(frozen=True)
class MachineConfig:
    """What a replay machine runs against and how (see `replay_machine`)."""

    target: str | Target
    config: Mapping[str, Any] = field(default_factory=dict)
    device: str | None = None
    layers: Layers = "all"
    seed: int = 0
    reset: Reset = "capture"
    check: StepCheck | None = None
    log: FindingLog | None = None
    distributions: tuple[str, ...] = DISTRIBUTIONS
    edge_cases: tuple[str, ...] = EDGE_CASES
    isolate: bool | None = None
    step_timeout: float | Literal["auto"] | None = "auto"
    shrink_seconds: float | None = SHRINK_SECONDS
    async_pressure_us: float | None = None
    pipeline: bool = False

    def key(self) -> tuple[Any, ...]:
        tgt = self.target if isinstance(self.target, str) else f"{target_spec(self.target)}@{id(self.target)}"
        return (
            tgt,
            json.dumps(dict(self.config), sort_keys=True, default=str),
            self.device,
            self.layers,
            self.seed,
            self.isolated(),
            self.step_timeout,
            self.async_pressure_us,
        )

    def isolated(self) -> bool:
        """Run the session in a worker process (restarted after a fault or hang): by default on CUDA, where a fault
        poisons the process; never for a target instance (it cannot cross the process boundary)."""
        if not isinstance(self.target, str):
            return False
        if self.isolate is not None:
            return self.isolate
        from flashcheck.session import default_device

        return str(self.device or default_device()).startswith("cuda")


class _Sessions:
    """Open sessions, one per `MachineConfig.key()`; closed at exit or by `close_sessions()`."""

    def __init__(self) -> None:
        self._open: dict[tuple[Any, ...], tuple[contextlib.ExitStack, Driver | IsolatedDriver]] = {}
        self._facts: list[dict[str, str]] = []  # layer facts of the sessions closed so far
        self._exercised: dict[str, Exercised] = {}  # per target name: what the sessions closed so far exercised
        self._selected: dict[str, set[str]] = {}  # per target name: the checks its sessions' configurations run

    def layer_facts(self) -> dict[str, str]:
        """The detection layers of every session of this process so far (`Driver.layer_facts`), merged: a fact
        that differed between sessions lists each value once, joined with `` | ``."""
        return merge_facts(*self._facts, *(drv.layer_facts() for _, drv in self._open.values()))

    def exercised(self) -> dict[str, Exercised]:
        """Per target name, the checks every session of this process so far exercised (`Driver.exercised`)."""
        return merge_by_target(self._exercised, *({d.target.name: d.exercised()} for _, d in self._open.values()))

    def selected(self) -> dict[str, set[str]]:
        """Per target name, the checks the configurations of its sessions so far select (`driver.checks_run`)."""
        return {name: set(ids) for name, ids in self._selected.items()}

    def driver(self, cfg: MachineConfig) -> Driver | IsolatedDriver:
        key = cfg.key()
        hit = self._open.get(key)
        if hit is not None and not hit[1].poisoned:
            return hit[1]
        if hit is not None:
            self.drop(key)
        stack = contextlib.ExitStack()
        try:
            drv: Driver | IsolatedDriver
            common: dict[str, Any] = {
                "config": cfg.config or None,
                "device": cfg.device,
                "layers": cfg.layers,
                "seed": cfg.seed,
                "async_pressure_us": cfg.async_pressure_us,
            }
            if cfg.isolated():
                assert isinstance(cfg.target, str)
                timeout = cfg.step_timeout if cfg.step_timeout != "auto" else default_step_timeout("cuda")
                drv = stack.enter_context(IsolatedDriver(cfg.target, step_timeout=timeout, **common))
            else:
                drv = stack.enter_context(open_session(cfg.target, step_timeout=cfg.step_timeout, **common))
        except BaseException:
            stack.close()
            raise
        self._open[key] = (stack, drv)
        self._selected.setdefault(drv.target.name, set()).update(_selected_checks(cfg))
        return drv

    def forget_layer_facts(self) -> None:
        self._facts, self._exercised, self._selected = [], {}, {}

    def drop(self, key: tuple[Any, ...]) -> None:
        hit = self._open.pop(key, None)
        if hit is not None:
            facts = hit[1].layer_facts()
            if facts and facts not in self._facts:
                self._facts.append(facts)
            self._exercised = merge_by_target(self._exercised, {hit[1].target.name: hit[1].exercised()})
            hit[0].close()

    def close(self) -> None:
        for key in list(self._open):
            self.drop(key)


def _selected_checks(cfg: MachineConfig) -> list[str]:
    """The checks a session of `cfg` runs on every step (`driver.checks_run`)."""
    from flashcheck.driver import checks_run
    from flashcheck.session import default_device

    device = str(cfg.device or default_device())
    timeout = cfg.step_timeout if cfg.step_timeout != "auto" else default_step_timeout(device)
    return checks_run(cfg.layers, watchdog=timeout is not None, cuda=device.startswith("cuda"))


SESSIONS = _Sessions()
atexit.register(SESSIONS.close)
