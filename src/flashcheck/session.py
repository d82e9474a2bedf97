"""One entry point to run scenarios: build the target, open the runtime checker, drive the steps.

The fuzzer, campaigns, ``flashcheck replay`` and the pytest plugin all go through `open_session`, so a finding
reproduces under exactly the machinery that found it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from flashcheck.driver import WARM_UP_SCALE, Driver
from flashcheck.errors import EnvironmentUnavailable, FlashcheckError, InvalidArgument
from flashcheck.runtime.api import CheckerLike, NullChecker
from flashcheck.scenario import Scenario, Step, StepResult
from flashcheck.targets.protocol import Target, check_target
from flashcheck.targets.registry import make_target
from flashcheck.watchdog import default_step_timeout

__all__ = ["Layers", "default_device", "make_checker", "open_session", "run_scenario", "run_steps"]

Layers = Literal["off", "cheap", "all", "races"]


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# Guard zones of 64 KiB: an overflow up to that far past a workspace lands in memory the arena owns and is reported
# (FC302) instead of corrupting a neighbour; the cost is 128 KiB per workspace.
GUARD_BYTES = 64 << 10


@contextlib.contextmanager
def make_checker(layers: Layers, device: str, *, cold_regions: Iterable[str] = ()) -> Iterator[CheckerLike]:
    """The runtime checker with the chosen detection layers (``off``: regions and the arena only); `cold_regions`
    are per-step regions the target declares cold (`Target.cold_regions`)."""
    if layers not in ("off", "cheap", "all", "races"):
        raise InvalidArgument(f"layers must be 'off', 'cheap', 'all' or 'races', got {layers!r}")
    from flashcheck.runtime.arena import Arena
    from flashcheck.runtime.checker import Checker

    if layers == "off":
        yield NullChecker(Arena(guard_bytes=GUARD_BYTES))
        return
    with Checker(layers=layers, device=device, cold_regions=cold_regions, guard_bytes=GUARD_BYTES) as chk:
        yield chk


def check_device(device: str) -> None:
    """`EnvironmentUnavailable` for a CUDA device this machine does not have; `InvalidArgument` for a device that is
    neither ``cpu`` nor ``cuda[:N]``."""
    if device == "cpu":
        return
    if not (device == "cuda" or device.startswith("cuda:")):
        raise InvalidArgument(f"device {device!r}: use cpu or cuda (cuda:N for one GPU)")
    from flashcheck.fuzzing.options import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is not None:
        raise EnvironmentUnavailable(f"device {device}: {reason}")


@contextlib.contextmanager
def open_session(
    target: str | Target,
    *,
    config: Mapping[str, Any] | None = None,
    device: str | None = None,
    layers: Layers = "all",
    seed: int = 0,
    worker: int = 0,
    step_timeout: float | Literal["auto"] | None = "auto",
    hang_file: Path | None = None,
    hard_exit: bool = False,
    warm_up_scale: float = WARM_UP_SCALE,
    async_pressure_us: float | None = None,
) -> Iterator[Driver]:
    """Build (or validate) the target, open the checker, set the target up; yields a ready `Driver`.

    `step_timeout`: seconds before a step is FC252 step-hung (``auto``: `default_step_timeout`; None: no watchdog).
    `hang_file` and `hard_exit` are for isolated workers (see `flashcheck.watchdog.Watchdog`).
    `async_pressure_us`: the device-side delay before each host-side preparation (`Driver`; None: off)."""
    dev = device or default_device()
    check_device(dev)
    tgt = make_target(target, **dict(config or {})) if isinstance(target, str) else check_target(target)
    timeout = default_step_timeout(dev) if step_timeout == "auto" else step_timeout
    with make_checker(layers, dev, cold_regions=getattr(tgt, "cold_regions", ())) as chk:
        drv = Driver(
            tgt,
            chk,
            device=dev,
            seed=seed,
            worker=worker,
            step_timeout=timeout,
            hang_file=hang_file,
            hard_exit=hard_exit,
            warm_up_scale=warm_up_scale,
            async_pressure_us=async_pressure_us,
        )
        drv.setup()
        try:
            yield drv
        finally:
            drv.close()
            try:
                tgt.teardown()
            except Exception:
                if not drv.poisoned:  # after a fault, freeing device memory fails too: the fault is reported
                    raise


def run_scenario(
    scenario: Scenario,
    *,
    device: str | None = None,
    layers: Layers = "all",
    stop_at: int | None = None,
    on_step: Callable[[int, StepResult], None] | None = None,
    target: Target | None = None,
    async_pressure_us: float | None = None,
) -> list[StepResult]:
    """Run `scenario` (steps ``0..stop_at`` inclusive) in a fresh session; returns every step's result. Each step
    settles while the next is prepared (`run_steps`): `on_step` sees a result then, in step order."""
    results: list[StepResult] = []
    tgt: str | Target = target if target is not None else scenario.target
    cfg = None if target is not None else scenario.target_config
    with open_session(
        tgt, config=cfg, device=device, layers=layers, seed=scenario.seed, async_pressure_us=async_pressure_us
    ) as drv:
        steps = scenario.steps if stop_at is None else scenario.steps[: stop_at + 1]
        for i, r in run_steps(drv, steps):
            results.append(r)
            if on_step is not None:
                on_step(i, r)
    return results


def run_steps(drv: Driver, steps: Sequence[Step]) -> Iterator[tuple[int, StepResult]]:
    """Run `steps` (indices from 0) in `drv` as sessions and workers run them, yielding each step's result in step
    order: a step settles once the next one is prepared, and its result comes before the next one runs
    (`Driver.prepare`). Stops after a fault or hang left the process unusable; a step the target cannot take raises
    `InvalidArgument` after the results before it."""
    for i, step in enumerate(steps):
        try:
            done = drv.prepare(step, i)
        except FlashcheckError:  # a step we were called wrong with: the one before still counts
            yield from drv.finish()
            raise
        yield from done
        drv.launch()
        if drv.poisoned:  # a fault or hang was reported; nothing after it can run in this process
            break
    yield from drv.finish()
