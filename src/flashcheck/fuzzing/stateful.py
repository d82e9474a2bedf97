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

import collections
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis import target as hypothesis_target
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from flashcheck.errors import InvalidArgument, ViolationFound
from flashcheck.exercised import Exercised
from flashcheck.findings import Finding
from flashcheck.fuzzing.determinism import no_source_constants
from flashcheck.fuzzing.distributions import DISTRIBUTIONS
from flashcheck.fuzzing.options import PROFILES, Budget, active_options, parse_budget, resolve_profile
from flashcheck.fuzzing.recorder import FindingLog, Recorded, default_log, describe
from flashcheck.fuzzing.sessions import SESSIONS, SHRINK_SECONDS, MachineConfig, Reset, StepCheck
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
from flashcheck.scenario import Scenario, Step, StepResult
from flashcheck.session import Layers
from flashcheck.targets.protocol import Capacity, Target, check_target
from flashcheck.targets.registry import make_target, target_spec
from flashcheck.watchdog import STEP_HUNG

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
    "session_selected",
]


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


_BURST = 8  # at most this many replays per replay rule: serving runs many steps between two captures
_FIRST_ROUND = 3  # examples in the first round of a time budget (then sized from the measured time per example)


def close_sessions() -> None:
    """Tear down every cached fuzz session and forget their layer facts (the pytest plugin calls this at the end
    of the run: the next run in this process starts with none)."""
    SESSIONS.close()
    SESSIONS.forget_layer_facts()


def session_exercised() -> dict[str, Exercised]:
    """Per target name, the checks the fuzz sessions of this process exercised (``run.json``
    ``"checks_by_target"``, `flashcheck.exercised`)."""
    return SESSIONS.exercised()


def session_selected() -> dict[str, set[str]]:
    """Per target name, the checks the fuzz sessions of this process selected (what `session_exercised` is
    measured against)."""
    return SESSIONS.selected()


def session_layer_facts() -> dict[str, str]:
    """The detection layers the fuzz sessions of this process ran, and the ones they skipped with why (facts for
    a run's environment: ``"detection layers"``, ``"layers skipped"``)."""
    return SESSIONS.layer_facts()


class ReplayMachine(RuleBasedStateMachine):
    """Base of the machines `replay_machine` builds; holds one example's steps and drives them."""

    cfg: ClassVar[MachineConfig]
    cap: ClassVar[Capacity]
    spec: ClassVar[str]
    target_config: ClassVar[dict[str, Any]]
    # the first failure of this run (monotonic time) and the latest failing example's reproducers: the smallest so far
    failed_at: ClassVar[float | None] = None
    last_failure: ClassVar[tuple[Recorded, ...]] = ()
    # a pipelined step's findings judged after its example ended on an overrun (raised by `fuzz_target`)
    unraised: ClassVar[tuple[Recorded, ...]] = ()

    def __init__(self) -> None:
        super().__init__()
        cfg = type(self).cfg
        self.driver = SESSIONS.driver(cfg)
        self.driver.reset_example()  # this example captures every bucket it replays
        self.steps: list[Step] = []
        self.pipelined = cfg.pipeline and isinstance(self.driver, IsolatedDriver)
        self._in_flight: collections.deque[tuple[int, Step]] = collections.deque()
        self.captured: set[int] = set()
        self.ws_fraction = 0.0
        self.ws_bytes = 0
        self.max_tokens = 0

    # ---- helpers ----------------------------------------------------------------------------------------------
    def scenario(self) -> Scenario:
        return Scenario(self.spec, tuple(self.steps), seed=self.cfg.seed, target_config=self.target_config)

    def run_step(self, step: Step) -> None:
        """Run `step` and judge its result (`fail` on findings). Pipelined (`MachineConfig.pipeline`), the step is
        sent to the worker and judged when the next step is sent or the example ends, so the worker runs it while
        Hypothesis draws the next; the next step is sent before the one before it is judged, so the worker finds it
        waiting when it finishes a step. The example and the step a finding names are the same either way (a step
        sent after a failing one runs, and its result belongs to no example)."""
        index = len(self.steps)
        self.steps.append(step)
        if not self.pipelined:
            self._judge(step, index, self.driver.execute(step, index))
            return
        assert isinstance(self.driver, IsolatedDriver)
        try:
            self.driver.submit(step, index)
        except BaseException:
            self.settle()  # the steps sent before it are judged first, as unpipelined
            raise
        self._in_flight.append((index, step))
        while len(self._in_flight) > 1:
            self._settle_oldest()

    def settle(self) -> None:
        """Judge every step in flight, oldest first (pipelined runs)."""
        while self._in_flight:
            self._settle_oldest()

    def _settle_oldest(self) -> None:
        index, step = self._in_flight.popleft()
        assert isinstance(self.driver, IsolatedDriver)
        try:
            self._judge(step, index, self.driver.collect())
        except BaseException:
            self._in_flight.clear()  # sent after a failing step: no example's (`reset_example` drains them)
            raise

    def _judge(self, step: Step, index: int, result: StepResult) -> None:
        if step.op == "capture" and step.bucket is not None and result.rejected is None:
            self.captured.add(step.bucket)
        if result.rejected is not None:
            event(f"rejected {step.op}: {result.rejected.split(':')[0]}")
            return
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
        if any(s.op == "capture" and s.bucket == bucket for _, s in self._in_flight):
            self.settle()  # whether the bucket is captured depends on the capture in flight
        if bucket not in self.captured:  # grow to a new bucket: the engine captures it on first use
            self.run_step(self.make_step("capture", p, alloc, bucket))
        self.run_step(self.make_step("replay", p, alloc, bucket))

    def teardown(self) -> None:
        try:
            self.settle()
        except (FuzzFailure, _NotShrinkable) as exc:
            if not _frozen():
                raise
            # the example ended on an overrun: Hypothesis can no longer take a failure, so the run raises it
            type(self).unraised = exc.records
            return
        # steer campaigns toward large workspace use and long sequences (one observation per label per example)
        hypothesis_target(float(self.ws_fraction), label="workspace fraction used")
        hypothesis_target(float(self.ws_bytes), label="workspace bytes used")
        hypothesis_target(float(len(self.steps)), label="steps in sequence")
        hypothesis_target(float(self.max_tokens), label="kv tokens in a batch")
        if self.cfg.reset == "session":
            SESSIONS.drop(self.cfg.key())


def _frozen() -> bool:
    """Whether the running example's data is frozen (it ended on an overrun and takes no more outcomes)."""
    from hypothesis.control import current_build_context

    try:
        return bool(current_build_context().data.frozen)
    except Exception:  # no example running (the machine driven by hand)
        return False


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
    pipeline: bool = False,
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
        pipeline: with an isolated session, send each step to the worker and judge it when the next is sent, so
            the worker runs a step while Hypothesis draws the next (`fuzz_target` turns it on; a machine run by
            ``run_state_machine_as_test`` directly may end an example on an overrun whose last step's findings it
            cannot report, so it stays off there).

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
        pipeline=pipeline,
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
    `replay_machine` (``pipeline`` defaults to True here).
    """
    prof = resolve_profile(profile)
    bud = parse_budget(budget) if budget is not None else Budget(examples=PROFILES[prof].examples)
    machine_kw.setdefault("pipeline", True)
    machine = replay_machine(target, config=config, seed=seed, **machine_kw)
    machine.failed_at, machine.last_failure, machine.unraised = None, (), ()
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
        if machine.unraised:
            raise FuzzFailure(machine.unraised)
        rounds += 1
        asked += examples
        if bud.seconds is None or time.monotonic() - t0 >= bud.seconds:
            break
    return FuzzReport(
        target=machine.spec, seed=seed, budget=bud, profile=prof, rounds=rounds, elapsed=time.monotonic() - t0
    )
