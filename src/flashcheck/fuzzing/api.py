"""``@flashcheck.fuzz``: turn a function into a fuzz test of replay sequences against a target (yours or built-in).

::

    import flashcheck

    @flashcheck.fuzz(target="mypkg.backend:MyTarget", budget=200)
    def test_my_backend(step, result):      # optional: your own property, called after every step
        assert result.sample is None or result.sample.padded >= result.sample.batch_size

The test runs the replay state machine (`flashcheck.fuzzing.stateful`) under the run's profile and seed (the pytest
plugin's ``--flashcheck-*`` options), fails with `FuzzFailure` (findings, reproducer paths, the shrunk program) and
is skipped when the environment cannot run the target. A zero-argument function is called once before fuzzing (to
skip or prepare); a two-argument function ``(step, result)`` is an extra property checked after every step.
"""

from __future__ import annotations

import inspect
import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flashcheck.errors import InvalidDefinition
from flashcheck.fuzzing.distributions import DISTRIBUTIONS
from flashcheck.fuzzing.options import Budget, active_options, parse_budget
from flashcheck.fuzzing.recorder import default_log
from flashcheck.fuzzing.sessions import Reset, StepCheck
from flashcheck.fuzzing.stateful import FuzzFailure, ReplayMachine, fuzz_target, replay_machine
from flashcheck.fuzzing.strategies import EDGE_CASES
from flashcheck.session import Layers
from flashcheck.targets.protocol import Target
from flashcheck.targets.registry import GPU_TARGETS

__all__ = ["FuzzSpec", "FuzzTest", "fuzz", "test_seed"]

TargetArg = str | Target | Callable[[], Target] | None


@dataclass(frozen=True)
class FuzzSpec:
    """What a ``@fuzz`` test was declared with (read by the pytest plugin to add markers)."""

    target: TargetArg
    config: Mapping[str, Any] = field(default_factory=dict)
    budget: Budget | None = None
    seed: int | None = None
    profile: str | None = None
    layers: Layers = "all"
    device: str | None = None
    reset: Reset = "capture"
    step_count: int | None = None
    distributions: tuple[str, ...] = DISTRIBUTIONS
    edge_cases: tuple[str, ...] = EDGE_CASES
    isolate: bool | None = None

    @property
    def needs_gpu(self) -> bool:
        """True for built-in FlashInfer targets (the plugin marks such tests ``gpu``)."""
        return isinstance(self.target, str) and self.target in GPU_TARGETS


def test_seed(run_seed: int, name: str) -> int:
    """A test's Hypothesis seed: the run seed mixed with the test's name (stable across runs and workers)."""
    return (run_seed + zlib.crc32(name.encode())) % (1 << 32)


class FuzzTest:
    """The runner behind a ``@fuzz`` test (``test.fuzz_test``): resolves options, builds the machine, runs it."""

    def __init__(self, fn: Callable[..., Any], spec: FuzzSpec) -> None:
        self.fn = fn
        self.spec = spec
        self.__qualname__ = fn.__qualname__
        self.__module__ = fn.__module__
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) not in (0, 2):
            raise InvalidDefinition(
                f"@fuzz test {fn.__qualname__} takes {len(params)} argument(s); it takes none (called once before "
                "fuzzing) or two, (step, result), checked after every step"
            )
        self._check: StepCheck | None = fn if len(params) == 2 else None

    def __repr__(self) -> str:
        return f"<flashcheck fuzz test {self.__qualname__}>"

    def resolve(self) -> dict[str, Any]:
        """The effective settings of this run: decorator values, overridden by the run's options where given."""
        spec, opts = self.spec, active_options()
        target: Any = spec.target if spec.target is not None else (opts.target or "cpu-reference")
        if callable(target) and not isinstance(target, str) and not hasattr(target, "capacity"):
            target = target()
        if spec.seed is not None:
            seed = spec.seed
        else:
            run_seed = opts.seed if opts.seed is not None else random.randrange(1 << 32)
            seed = test_seed(run_seed, f"{self.__module__}.{self.__qualname__}")
        return {
            "target": target,
            "budget": opts.budget or spec.budget,
            "seed": seed,
            "profile": spec.profile or opts.profile,
        }

    def machine(self) -> type[ReplayMachine]:
        """The state machine class this test runs (e.g. for ``hypothesis.stateful.run_state_machine_as_test``)."""
        r, spec = self.resolve(), self.spec
        return replay_machine(
            r["target"],
            config=spec.config,
            device=spec.device,
            layers=spec.layers,
            seed=r["seed"],
            reset=spec.reset,
            check=self._check,
            log=default_log(),
            distributions=spec.distributions,
            edge_cases=spec.edge_cases,
            isolate=spec.isolate,
        )

    def run(self) -> None:
        if self._check is None:
            self.fn()
        r, spec = self.resolve(), self.spec
        try:
            fuzz_target(
                r["target"],
                config=spec.config,
                budget=r["budget"],
                seed=r["seed"],
                profile=r["profile"],
                step_count=spec.step_count,
                device=spec.device,
                layers=spec.layers,
                reset=spec.reset,
                check=self._check,
                log=default_log(),
                distributions=spec.distributions,
                edge_cases=spec.edge_cases,
                isolate=spec.isolate,
            )
        except FuzzFailure as exc:
            note = f"flashcheck: seed {r['seed']}; rerun the whole run's seeds with --flashcheck-seed last"
            add_note = getattr(exc, "add_note", None)
            if add_note is not None:
                add_note(note)
            raise


def fuzz(
    target: TargetArg = None,
    *,
    config: Mapping[str, Any] | None = None,
    budget: Budget | str | int | float | None = None,
    seed: int | None = None,
    profile: str | None = None,
    layers: Layers = "all",
    device: str | None = None,
    reset: Reset = "capture",
    step_count: int | None = None,
    distributions: Sequence[str] = DISTRIBUTIONS,
    edge_cases: Sequence[str] = EDGE_CASES,
    isolate: bool | None = None,
) -> Callable[[Callable[..., Any]], Callable[[], None]]:
    """Decorate a test function to fuzz replay sequences against `target`.

    Args:
        target: a built-in name (``"decode-tc"``), a ``"module:Class"`` spec, a `Target` instance or a zero-argument
            factory returning one; None: ``--flashcheck-target`` or the CPU reference target. Prefer a name or a spec:
            reproducers of an instance record ``"module:Class"`` and its ``config()``, so the class must be importable.
        config: target configuration for a name or spec.
        budget: examples (``200``) or time (``"30s"``); ``--flashcheck-budget`` overrides it. Default: the profile's.
        seed: pin the Hypothesis seed; default: derived from the run's ``--flashcheck-seed`` and the test's name.
        profile: ``ci``, ``gpu``, ``nightly`` or ``auto``; default: ``--flashcheck-profile``.
        layers, device, reset, step_count, distributions, edge_cases, isolate: see
            `flashcheck.fuzzing.stateful.replay_machine`.
    """
    spec = FuzzSpec(
        target=target,
        config=dict(config or {}),
        budget=parse_budget(budget) if budget is not None else None,
        seed=seed,
        profile=profile,
        layers=layers,
        device=device,
        reset=reset,
        step_count=step_count,
        distributions=tuple(distributions),
        edge_cases=tuple(edge_cases),
        isolate=isolate,
    )

    def decorate(fn: Callable[..., Any]) -> Callable[[], None]:
        runner = FuzzTest(fn, spec)

        # a plain function with no parameters: pytest collects it and asks for no fixtures
        def test() -> None:
            runner.run()

        test.__name__, test.__qualname__, test.__module__ = fn.__name__, fn.__qualname__, fn.__module__
        test.__doc__ = fn.__doc__
        test.fuzz_test = runner  # type: ignore[attr-defined]
        test.__flashcheck_fuzz__ = spec  # type: ignore[attr-defined]
        return test

    return decorate
