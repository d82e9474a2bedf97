"""Replay sequences as a Hypothesis state machine: capture buckets, replay real batches below them, recapture,
grow to new buckets, interleave eager steps and prefill chunks, with every property checked after every step.

One session (target set up, checker open, KV cache filled) is cached per target configuration and reused by every
example: building it costs far more than a step (FlashInfer JIT, graph pools). Each example starts from a clean
slate anyway, because the machine's first step captures a bucket and every bucket an example uses is captured
*within* that example before it is replayed: graph buffers are rewritten by the capture, so an example's outcome
depends only on its own steps and shrinking stays stable. ``reset="session"`` opens a fresh session per example for
targets that keep other state across examples (slower, fully isolated).

A finding fails the example with `FuzzFailure`; Hypothesis shrinks it to the shortest sequence and smallest shapes,
and the reproducer of the final (smallest) example is left in the finding log's directory.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis import target as hypothesis_target
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from flashcheck.driver import Driver
from flashcheck.errors import InvalidArgument, ViolationFound
from flashcheck.exercised import Exercised, merge_by_target
from flashcheck.findings import Finding
from flashcheck.fuzzing.determinism import no_source_constants
from flashcheck.fuzzing.distributions import DISTRIBUTIONS
from flashcheck.fuzzing.options import PROFILES, Budget, active_options, parse_budget, resolve_profile
from flashcheck.fuzzing.recorder import FindingLog, Recorded, default_log, describe
from flashcheck.fuzzing.strategies import (
    ALLOCATORS,
    EDGE_CASES,
    LengthParams,
    burst_params,
    capture_params,
    length_params,
    lengths_for,
)
from flashcheck.isolation import IsolatedDriver
from flashcheck.known import split_known
from flashcheck.rundir import merge_facts
from flashcheck.scenario import Scenario, Step, StepResult
from flashcheck.session import Layers, open_session
from flashcheck.targets.protocol import Capacity, Target, check_target
from flashcheck.targets.registry import make_target, target_spec
from flashcheck.watchdog import STEP_HUNG, default_step_timeout

__all__ = [
    "FuzzFailure",
    "FuzzReport",
    "MachineConfig",
    "ReplayMachine",
    "close_sessions",
    "fuzz_target",
    "replay_machine",
    "session_exercised",
    "session_layer_facts",
]

Reset = Literal["capture", "session"]
SHRINK_SECONDS = 60.0  # default shrink time of one failure (`MachineConfig.shrink_seconds`)
StepCheck = Callable[[Step, StepResult], None]


class _NotShrinkable(BaseException):  # Hypothesis lets a BaseException through unshrunk
    """A failure Hypothesis must not shrink (further): a hang costs its whole timeout on every shrink attempt, and
    shrinking past `MachineConfig.shrink_seconds` (each attempt at a faulting step restarts a worker) ends with the
    smallest failing example found so far."""

    def __init__(self, records: Sequence[Recorded], why: str) -> None:
        super().__init__(why)
        self.records = tuple(records)
        self.why = why


class FuzzFailure(ViolationFound):
    """A replay sequence produced findings; `records` hold the reproducers written for them."""

    def __init__(self, records: Sequence[Recorded]) -> None:
        super().__init__([r.finding for r in records])
        self.records = tuple(records)
        self.args = (f"{len(records)} finding(s)\n{describe(records, snippet=False)}",)


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

    def layer_facts(self) -> dict[str, str]:
        """The detection layers of every session of this process so far (`Driver.layer_facts`), merged: a fact
        that differed between sessions lists each value once, joined with `` | ``."""
        return merge_facts(*self._facts, *(drv.layer_facts() for _, drv in self._open.values()))

    def exercised(self) -> dict[str, Exercised]:
        """Per target name, the checks every session of this process so far exercised (`Driver.exercised`)."""
        return merge_by_target(self._exercised, *({d.target.name: d.exercised()} for _, d in self._open.values()))

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
            if cfg.isolated():
                assert isinstance(cfg.target, str)
                timeout = cfg.step_timeout if cfg.step_timeout != "auto" else default_step_timeout("cuda")
                drv = stack.enter_context(
                    IsolatedDriver(
                        cfg.target,
                        config=cfg.config or None,
                        device=cfg.device,
                        layers=cfg.layers,
                        seed=cfg.seed,
                        step_timeout=timeout,
                        async_pressure_us=cfg.async_pressure_us,
                    )
                )
            else:
                drv = stack.enter_context(
                    open_session(
                        cfg.target,
                        config=cfg.config or None,
                        device=cfg.device,
                        layers=cfg.layers,
                        seed=cfg.seed,
                        step_timeout=cfg.step_timeout,
                        async_pressure_us=cfg.async_pressure_us,
                    )
                )
        except BaseException:
            stack.close()
            raise
        self._open[key] = (stack, drv)
        return drv

    def forget_layer_facts(self) -> None:
        self._facts, self._exercised = [], {}

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


_SESSIONS = _Sessions()
_BURST = 8  # at most this many replays per replay rule: serving runs many steps between two captures
_FIRST_ROUND = 3  # examples in the first round of a time budget (then sized from the measured time per example)
atexit.register(_SESSIONS.close)


def close_sessions() -> None:
    """Tear down every cached fuzz session and forget their layer facts (the pytest plugin calls this at the end
    of the run: the next run in this process starts with none)."""
    _SESSIONS.close()
    _SESSIONS.forget_layer_facts()


def session_exercised() -> dict[str, Exercised]:
    """Per target name, the checks the fuzz sessions of this process exercised (``run.json``
    ``"checks_by_target"``, `flashcheck.exercised`)."""
    return _SESSIONS.exercised()


def session_layer_facts() -> dict[str, str]:
    """The detection layers the fuzz sessions of this process ran, and the ones they skipped with why (facts for
    a run's environment: ``"detection layers"``, ``"layers skipped"``)."""
    return _SESSIONS.layer_facts()


class ReplayMachine(RuleBasedStateMachine):
    """Base of the machines `replay_machine` builds; holds one example's steps and drives them."""

    cfg: ClassVar[MachineConfig]
    cap: ClassVar[Capacity]
    spec: ClassVar[str]
    target_config: ClassVar[dict[str, Any]]
    # the first failure of this run (monotonic time) and the latest failing example's reproducers: the smallest so far
    failed_at: ClassVar[float | None] = None
    last_failure: ClassVar[tuple[Recorded, ...]] = ()

    def __init__(self) -> None:
        super().__init__()
        cfg = type(self).cfg
        self.driver = _SESSIONS.driver(cfg)
        self.driver.reset_example()  # this example captures every bucket it replays
        self.steps: list[Step] = []
        self.captured: set[int] = set()
        self.ws_fraction = 0.0
        self.ws_bytes = 0
        self.max_tokens = 0

    # ---- helpers ----------------------------------------------------------------------------------------------
    def scenario(self) -> Scenario:
        return Scenario(self.spec, tuple(self.steps), seed=self.cfg.seed, target_config=self.target_config)

    def run_step(self, step: Step) -> StepResult:
        index = len(self.steps)
        self.steps.append(step)
        result = self.driver.execute(step, index)
        if step.op == "capture" and step.bucket is not None and result.rejected is None:
            self.captured.add(step.bucket)
        if result.rejected is not None:
            event(f"rejected {step.op}: {result.rejected.split(':')[0]}")
            return result
        if result.sample is not None:
            for used, allocated in result.sample.workspaces.values():
                self.ws_bytes = max(self.ws_bytes, int(used))
                if allocated:
                    self.ws_fraction = max(self.ws_fraction, used / allocated)
            self.max_tokens = max(self.max_tokens, result.sample.total_kv)
        unexpected, known = split_known(result.findings, self.driver.target.name)
        for f, _entry in known:  # documented upstream behaviour (flashcheck.known): counted, not a failure
            event(f"known upstream behaviour {f.id} ({f.name})")
        if unexpected:
            self.fail(index, unexpected)
        if self.cfg.check is not None:
            self.cfg.check(step, result)
        return result

    def fail(self, index: int, findings: Sequence[Finding]) -> None:
        log = self.cfg.log or default_log()
        records = log.record(
            self.scenario(),
            index,
            findings,
            layers=self.cfg.layers,
            seed=getattr(type(self), "_hypothesis_internal_use_seed", None),
            async_pressure_us=self.cfg.async_pressure_us,
        )
        if any(f.id == STEP_HUNG.id for f in findings):
            raise _NotShrinkable(records, "not shrunk: a hung step costs its whole timeout per attempt")
        cls = type(self)
        if cls.failed_at is None:
            cls.failed_at = time.monotonic()
        cls.last_failure = tuple(records)
        self._stop_shrinking()
        raise FuzzFailure(records)

    def _stop_shrinking(self) -> None:
        """End the run with the smallest failing example so far once shrinking has taken `shrink_seconds`.

        Called when an example fails, never before an example has drawn its steps: Hypothesis takes an example that
        stops earlier than the same choices did before for inconsistent data generation, not for a failure."""
        cls = type(self)
        limit = cls.cfg.shrink_seconds
        if cls.failed_at is None or limit is None or not cls.last_failure:
            return
        spent = time.monotonic() - cls.failed_at
        if spent > limit:
            raise _NotShrinkable(cls.last_failure, f"shrinking stopped after {spent:.0f}s (shrink_seconds={limit:g})")

    def make_step(
        self, op: Literal["eager", "capture", "replay"], p: LengthParams, alloc: str, bucket: int | None = None
    ) -> Step:
        q, k = lengths_for(self.cap, p)
        return Step(op, q, k, bucket=bucket, seed=p.seed, allocator=alloc)

    def replay_batch(self, p: LengthParams, alloc: str) -> None:
        bucket = self.cap.bucket_for(p.batch_size)
        if bucket is None:
            return
        if bucket not in self.captured:  # grow to a new bucket: the engine captures it on first use
            self.run_step(self.make_step("capture", p, alloc, bucket))
        self.run_step(self.make_step("replay", p, alloc, bucket))

    def teardown(self) -> None:
        # steer campaigns toward large workspace use and long sequences (one observation per label per example)
        hypothesis_target(float(self.ws_fraction), label="workspace fraction used")
        hypothesis_target(float(self.ws_bytes), label="workspace bytes used")
        hypothesis_target(float(len(self.steps)), label="steps in sequence")
        hypothesis_target(float(self.max_tokens), label="kv tokens in a batch")
        if self.cfg.reset == "session":
            _SESSIONS.drop(self.cfg.key())


def replay_machine(
    target: str | Target,
    *,
    config: Mapping[str, Any] | None = None,
    device: str | None = None,
    layers: Layers = "all",
    seed: int = 0,
    reset: Reset = "capture",
    check: StepCheck | None = None,
    log: FindingLog | None = None,
    distributions: Sequence[str] = DISTRIBUTIONS,
    edge_cases: Sequence[str] = EDGE_CASES,
    isolate: bool | None = None,
    step_timeout: float | Literal["auto"] | None = "auto",
    shrink_seconds: float | None = SHRINK_SECONDS,
    async_pressure_us: float | None = None,
) -> type[ReplayMachine]:
    """A `RuleBasedStateMachine` class that fuzzes replay sequences against `target`.

    Args:
        target: a built-in name, a ``"module:Class"`` spec, or a `Target` instance.
        config: target configuration (overrides its defaults); ignored for an instance.
        device: ``"cuda"``/``"cpu"``; default: CUDA when available.
        layers: runtime checker layers (``off``, ``cheap``, ``all``).
        seed: session seed (KV cache contents); also recorded in reproducers.
        reset: ``capture`` (cached session, each example captures what it replays) or ``session`` (fresh session
            per example).
        check: an extra property ``check(step, result)`` called after every step; raise to fail.
        log: where reproducers go (default: the process-wide log).
        isolate: run the session in a worker process that is restarted after a fault (FC250) or a hang (FC252),
            so the run goes on; default: on CUDA, for a target given by name.
        step_timeout: seconds before a step is FC252 step-hung (``auto``: 120 s on CUDA, none on the CPU).
        shrink_seconds: how long Hypothesis may shrink a failure before the run ends with the smallest failing
            example so far (on a GPU each attempt at a faulting step restarts a worker); None: no limit.
        async_pressure_us: device-side delay before each host-side preparation (see `flashcheck.pressure`);
            None: the run's ``--async-pressure-us`` (off unless given).

    Use it as any Hypothesis state machine: ``TestReplay = replay_machine("decode-tc").TestCase``.
    """
    if reset not in ("capture", "session"):
        raise InvalidArgument(f"reset must be 'capture' or 'session', got {reset!r}")
    tgt_obj = check_target(target) if not isinstance(target, str) else make_target(target, **dict(config or {}))
    cfg = MachineConfig(
        target=target,
        config=dict(config or {}) if isinstance(target, str) else {},
        device=device,
        layers=layers,
        seed=seed,
        reset=reset,
        check=check,
        log=log,
        distributions=tuple(distributions),
        edge_cases=tuple(edge_cases),
        isolate=isolate,
        step_timeout=step_timeout,
        shrink_seconds=shrink_seconds,
        async_pressure_us=async_pressure_us if async_pressure_us is not None else active_options().async_pressure_us,
    )
    cap = tgt_obj.capacity
    lp: dict[str, Any] = {"distributions": cfg.distributions, "edge_cases": cfg.edge_cases}
    allocs = st.sampled_from(ALLOCATORS)
    buckets = cap.buckets
    graph_lp = length_params(cap, max_batch=buckets[-1], **lp) if buckets else st.nothing()
    capture_args = capture_params(cap, **lp) if buckets else st.nothing()
    multi_q = cap.max_qo_len > 1
    prefill_lp = length_params(cap, distributions=("chunked_prefill",), edge_cases=cfg.edge_cases)
    spec_lp = (
        length_params(cap, distributions=("spec_decode",), edge_cases=cfg.edge_cases, max_batch=buckets[-1])
        if buckets
        else prefill_lp
    )

    class Machine(ReplayMachine):
        if buckets:

            @initialize(args=capture_args, alloc=allocs)
            def capture_bucket(self, args: tuple[int, LengthParams], alloc: str) -> None:
                """Engines capture before serving: every example starts with a capture."""
                bucket, p = args
                self.run_step(self.make_step("capture", p, alloc, bucket))

            @rule(args=capture_args, alloc=allocs)
            def recapture(self, args: tuple[int, LengthParams], alloc: str) -> None:
                """Capture (again) a bucket with another batch: replan and new graph."""
                bucket, p = args
                self.run_step(self.make_step("capture", p, alloc, bucket))

            @rule(p=graph_lp, alloc=allocs, more=st.integers(0, _BURST - 1))
            def replay(self, p: LengthParams, alloc: str, more: int) -> None:
                """Serve a burst of real batches through the smallest bucket that holds the first (capturing it
                first if new): `p`, then `more` batches that the same bucket serves (`burst_params`)."""
                for i in range(1 + more):
                    self.replay_batch(burst_params(self.cap, p, i), alloc)

        @rule(p=length_params(cap, **lp), alloc=allocs)
        def eager(self, p: LengthParams, alloc: str) -> None:
            """An eager (non-graph) step of any size up to the target's largest batch."""
            self.run_step(self.make_step("eager", p, alloc))

        if multi_q:

            @rule(p=prefill_lp, alloc=allocs)
            def prefill_chunk(self, p: LengthParams, alloc: str) -> None:
                """A chunked-prefill batch, eagerly (as engines run mixed prefill outside graphs)."""
                self.run_step(self.make_step("eager", p, alloc))

        if multi_q and buckets:

            @rule(p=spec_lp, alloc=allocs, more=st.integers(0, _BURST - 1))
            def spec_decode_replay(self, p: LengthParams, alloc: str, more: int) -> None:
                """A burst of speculative-decode verify batches (q_len 2-8 per request) through a graph."""
                for i in range(1 + more):
                    self.replay_batch(burst_params(self.cap, p, i), alloc)

    Machine.cfg = cfg
    Machine.cap = cap
    Machine.spec = target if isinstance(target, str) else target_spec(tgt_obj)
    Machine.target_config = dict(tgt_obj.config())
    Machine.__name__ = Machine.__qualname__ = f"ReplayMachine[{tgt_obj.name}]"
    # a separate example-database key per target configuration (the class source is shared)
    Machine._hypothesis_internal_add_digest = repr(cfg.key()[:2]).encode()
    return Machine


@dataclass
class FuzzReport:
    """How a clean fuzz run went (a run with findings raises `FuzzFailure` instead)."""

    target: str
    seed: int
    budget: Budget
    profile: str
    rounds: int
    elapsed: float


def machine_settings(
    profile: str, examples: int, *, step_count: int | None = None, database: Any = "default"
) -> settings:
    """Hypothesis settings of a fuzz run: the profile's step count and deadline, slow-data checks off."""
    spec = PROFILES[resolve_profile(profile)]
    kw: dict[str, Any] = {}
    if database != "default":
        kw["database"] = database
    # no explain phase: it re-runs the failing example hundreds of times to find "always-run" lines, which costs
    # more than the whole search on a GPU target and says little about a metadata bug
    phases = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
    return settings(
        max_examples=examples,
        stateful_step_count=step_count or spec.step_count,
        deadline=spec.deadline_ms,
        phases=phases,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
        **kw,
    )


def fuzz_target(
    target: str | Target,
    *,
    config: Mapping[str, Any] | None = None,
    budget: Budget | str | int | float | None = None,
    seed: int = 0,
    profile: str = "auto",
    step_count: int | None = None,
    database: Any = "default",
    **machine_kw: Any,
) -> FuzzReport:
    """Fuzz replay sequences against `target` until the budget is spent; raises `FuzzFailure` on findings.

    A time budget runs rounds with seeds ``seed, seed+1, ...`` until time is up (Hypothesis has no wall-clock
    stop): the first round runs `_FIRST_ROUND` examples, each later one as many as the time left allows at the
    measured time per example (at most the profile's count), so a run overshoots its budget by about one example.
    Every round first replays failures saved in the example database. Other keyword arguments go to
    `replay_machine`.
    """
    prof = resolve_profile(profile)
    bud = parse_budget(budget) if budget is not None else Budget(examples=PROFILES[prof].examples)
    machine = replay_machine(target, config=config, seed=seed, **machine_kw)
    machine.failed_at, machine.last_failure = None, ()
    t0 = time.monotonic()
    rounds = 0
    asked = 0
    while True:
        if bud.seconds is None:
            examples = bud.examples or PROFILES[prof].examples
        else:
            spent = time.monotonic() - t0
            per_example = spent / asked if asked else None
            cap = PROFILES[prof].examples
            examples = _FIRST_ROUND if per_example is None else int((bud.seconds - spent) / max(per_example, 1e-3))
            examples = max(1, min(cap, examples))
        hypothesis_seed(seed + rounds)(machine)
        try:
            with no_source_constants():  # the examples of a seed do not depend on what this process imported
                run_state_machine_as_test(
                    machine, settings=machine_settings(prof, examples, step_count=step_count, database=database)
                )
        except _NotShrinkable as exc:
            failure = FuzzFailure(exc.records)
            failure.args = (f"{failure.args[0]}\n({exc.why})",)
            raise failure from None
        rounds += 1
        asked += examples
        if bud.seconds is None or time.monotonic() - t0 >= bud.seconds:
            break
    return FuzzReport(
        target=machine.spec, seed=seed, budget=bud, profile=prof, rounds=rounds, elapsed=time.monotonic() - t0
    )
