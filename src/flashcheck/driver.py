"""The driver: runs scenario steps against a target under the runtime checker and checks every property.

It owns the KV cache and the queries (both seeded) and opens a region around every target call. Each call runs
inside an *error boundary*: on CUDA the driver synchronizes before leaving it, so a kernel fault surfaces in the
region that launched the work; a fault that still surfaces later (in flashcheck's own reads) is attributed to the
last target region of the step. The properties of `flashcheck.catalogue` run at the phases they declare
(`flashcheck.properties.phases`): after plan, before replay (on the buffers a graph reads), on every output, and on
every pair of outputs that must agree (each output against the fp32 reference; a replay that disagrees is explained
by a fresh eager run). Then the arena's FC302 and the runtime detectors' FC2xx. Every step runs under a watchdog
(FC252). Exceptions go through the classification table; none is a skip. With async pressure a device-side delay
is enqueued before each host-side preparation (``plan``, ``prepare_replay``), so the target's host work overlaps
queued device work as in an overlapped scheduler.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flashcheck.batch import BatchSpec
from flashcheck.campaign.checks import WORKER_CRASHED

# the catalogue by its own name, never ``from flashcheck import catalogue``: that takes the package's attribute, which
# can be a module sys.modules no longer holds (an in-process pytest run, pytester's, removes from sys.modules what it
# imported but leaves the package's attribute); its properties then declare the phases of a `Phase` class that is no
# longer this module's, and no property would ever run
from flashcheck.catalogue import CHECKS, PROPERTIES, properties
from flashcheck.deferred import Pending, Transfer
from flashcheck.errors import (
    ContextPoisoned,
    EnvironmentUnavailable,
    FlashcheckError,
    InvalidArgument,
    ViolationFound,
)
from flashcheck.exercised import Exercised
from flashcheck.findings import Finding, Location
from flashcheck.layout import PagedLayout
from flashcheck.pressure import AsyncPressure
from flashcheck.properties.phases import Phase
from flashcheck.rundir import Sample
from flashcheck.runtime.api import CheckerLike, Region
from flashcheck.runtime.checks.workspace import WORKSPACE_WITHIN_BOUNDS
from flashcheck.runtime.hooks import PRESETS
from flashcheck.scenario import Step, StepResult
from flashcheck.step_ops import StepOps, _TargetRaised
from flashcheck.targets.classify import TARGET_RAISED, classify_exception, finding_from_exception
from flashcheck.targets.protocol import Target, TargetEnv
from flashcheck.watchdog import STEP_HUNG, StepHung, Watchdog

__all__ = ["Driver", "checks_run"]

_LIFECYCLE = frozenset({TARGET_RAISED.id, STEP_HUNG.id, WORKER_CRASHED.id})  # runtime checks of no detection layer
_NO_WORKSPACE = "the target holds no workspace from the checker's arena"
_NO_PHASE = {
    Phase.BEFORE_REPLAY: "the target captures no CUDA graphs (no buckets)",
    Phase.COMPARE: "the target captures no CUDA graphs and the session does not compare with the reference",
}

WARM_UP_SCALE = 5.0  # the step timeout of a process's first eager and capture step (see warms_up), times this
_WARMED: set[str] = set()  # step kinds this process has run once (imports done, kernels compiled)


def warms_up(op: str) -> bool:
    """Whether the next step of kind `op` (eager, capture, replay) in this process is its first, which gets
    `WARM_UP_SCALE` times the step timeout: it pays for lazy imports and the backend's JIT compiles. A replay after
    a capture in the same process does not: the capture ran (and compiled) the kernels the graph replays, so a
    replay that outlasts the plain timeout there is a hang (a kernel that never ends), found five times sooner."""
    return op not in _WARMED and not (op == "replay" and "capture" in _WARMED)


def checks_run(layers: str, *, watchdog: bool, campaign: bool = False, cuda: bool = False) -> list[str]:
    """The check IDs a run of this driver executes on every step: the properties, the arena's FC302 and FC250
    always, the runtime detectors unless ``layers="off"`` (a check that one layer alone runs, such as FC204 of the
    staging layer, only where that layer is selected and a CUDA device runs it), FC252 with a step watchdog, FC251 in
    a campaign (its supervisor)."""
    ids = {p.check.id for p in PROPERTIES} | {WORKSPACE_WITHIN_BOUNDS.id, TARGET_RAISED.id}
    if layers != "off":
        selected = PRESETS.get(layers, ())
        ids |= {
            c.id
            for c in CHECKS
            if c.kind == "runtime" and c.id not in _LIFECYCLE and (c.layer is None or (cuda and c.layer in selected))
        }
    if watchdog:
        ids.add(STEP_HUNG.id)
    if campaign:
        ids.add(WORKER_CRASHED.id)
    return sorted(ids)


class Driver(StepOps):
    """Runs steps against a target under a checker. Create, `setup()`, then `execute()` each step, or `submit()`
    each and `finish()` at the end, to let the host prepare a step while the device finishes the one before.

    Args:
        target: the code under test.
        checker: the runtime checker (or a `NullChecker`).
        device: ``"cuda"`` or ``"cpu"``.
        seed: session seed (KV cache and query pool contents).
        check_reference: compare every output with the fp32 reference (FC303).
        worker: campaign worker index recorded in samples.
        replay_malformed: replay even when the graph's buffers fail FC301 (the kernel may fault).
        step_timeout: seconds a step may take before it is FC252 step-hung (None: no watchdog).
        hang_file: where the C-level watchdog writes every thread's stack when a step cannot be interrupted.
        hard_exit: end the process when a hung step cannot be interrupted (isolated workers only).
        warm_up_scale: the first eager and capture step (and a first replay before any capture) of the process may
            take this many timeouts (lazy imports, kernel JIT compiles).
        async_pressure_us: device-side delay (microseconds) enqueued on the stream before each ``plan`` and
            ``prepare_replay`` (None or 0: off, costs nothing); see `flashcheck.pressure`.
    """

    def __init__(
        self,
        target: Target,
        checker: CheckerLike,
        *,
        device: str = "cpu",
        seed: int = 0,
        check_reference: bool = True,
        worker: int = 0,
        replay_malformed: bool = False,
        step_timeout: float | None = None,
        hang_file: Path | None = None,
        hard_exit: bool = False,
        warm_up_scale: float = WARM_UP_SCALE,
        async_pressure_us: float | None = None,
    ) -> None:
        self.target = target
        self.pressure = AsyncPressure(async_pressure_us, device=device)
        self.warm_up_scale = warm_up_scale
        self.checker = checker
        self.device = device
        self.seed = seed
        self.check_reference = check_reference
        self.worker = worker
        self.replay_malformed = replay_malformed
        self.cap = target.capacity
        self.captured: dict[int, list[int] | None] = {}
        self.t0 = time.perf_counter()
        self.poisoned = False
        self.steps_run = 0
        self._cuda = str(device).startswith("cuda")
        self._last_region: tuple[Region, str] | None = None
        self._watchdog = Watchdog(step_timeout, hang_file=hang_file, hard_exit=hard_exit) if step_timeout else None
        self._torch: Any = None
        self._q_pool: Any = None
        self._graphed_ref: Any = None
        self._exercised = Exercised()
        self._pending: Pending | None = None
        self._prepared: Callable[[], None] | None = None

    # ---- setup -----------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Fill the KV cache and set the target up. An error of the target's own setup is classified like any
        other: `EnvironmentUnavailable` only for an explicit cause, else `ViolationFound` with its finding."""
        import torch

        self._torch = torch
        tpl = self.cap.template
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        kv_dt = getattr(torch, tpl.kv_dtype)
        shape_k = (self.cap.max_pages, tpl.page_size, tpl.num_kv_heads, tpl.head_dim_qk)
        shape_v = (self.cap.max_pages, tpl.page_size, tpl.num_kv_heads, tpl.head_dim_vo)
        k = torch.randn(shape_k, generator=gen).to(kv_dt).to(self.device)
        if self.cap.value_from_key:  # MLA: V is ckv, the first head_dim_vo columns of K
            v = k[..., : tpl.head_dim_vo]
        else:
            v = torch.randn(shape_v, generator=gen).to(kv_dt).to(self.device)
        self.k_cache, self.v_cache = k, v
        with self.checker.checker_read():
            self.pressure.calibrate()
        loc = Location(target=self.target.name, step_name="setup", region="setup")
        self._exercised.mark(TARGET_RAISED.id)  # the target is called: what it raises is classified from here on
        try:
            with self.checker.region("setup", step_name="setup"):
                self.target.setup(TargetEnv(device=self.device, arena=self.checker.arena, k_cache=k, v_cache=v))
                self._sync()
        except FlashcheckError:
            raise
        except Exception as exc:
            cls = classify_exception(exc)
            if cls.verdict == "environment":
                raise EnvironmentUnavailable(f"{self.target.name}: {cls.reason}: {exc}") from exc
            self.poisoned = cls.poisons_context
            raise ViolationFound([finding_from_exception(exc, cls, loc)]) from exc

    def reset_example(self) -> None:
        """Forget captured graphs' plan_info and pending detector events (a new fuzz example starts)."""
        if self._pending is not None or self._prepared is not None:
            raise InvalidArgument("reset_example() while a submitted step is pending: call finish() first")
        self.captured.clear()
        with self.checker.checker_read():
            self.checker.drain_findings()

    def layer_facts(self) -> dict[str, str]:
        """The detection layers this session's checker runs, and the ones it could not run with why (run facts:
        ``"detection layers"``, and ``"layers skipped"`` when any was), for a run's environment."""
        active = list(getattr(self.checker, "active_layers", ()))
        skipped = dict(getattr(self.checker, "skipped_layers", {}))
        hook = getattr(self.checker, "hook", None)
        note = getattr(hook("cupti"), "backend_note", None) if callable(hook) else None
        named = [f"{n} ({note})" if n == "cupti" and note else n for n in active]
        facts = {"detection layers": ", ".join(named) or "none (layers off)"}
        if skipped:
            facts["layers skipped"] = "; ".join(f"{name}: {why}" for name, why in sorted(skipped.items()))
        return facts

    def exercised(self) -> Exercised:
        """The checks this session exercised so far (`flashcheck.exercised`), and those that cannot apply to its
        target here with why: properties of phases no step of this target reaches, FC302 without an arena workspace,
        runtime detectors no active detection layer sees (ask before the session closes, as `layer_facts`)."""
        out = self._exercised.merged()
        phases = {Phase.AFTER_PLAN, Phase.ON_OUTPUT}
        phases |= {Phase.BEFORE_REPLAY, Phase.COMPARE} if self.cap.buckets else set()
        phases |= {Phase.COMPARE} if self.check_reference else set()
        for p in PROPERTIES:
            if not any(q.phase in phases for q in PROPERTIES if q.check is p.check):
                out.cannot_apply(p.check.id, f"its phase ({p.phase.value}) never comes: {_NO_PHASE[p.phase]}")
        runtime = getattr(self.checker, "exercised", None)
        applicable = getattr(self.checker, "applicable", None)
        if callable(runtime) and callable(applicable):  # a `Checker` (a `NullChecker` has no detection layer)
            out.mark(*runtime())
            seen = applicable()
            # the layers by name: why each was skipped is the run's "layers skipped" fact
            skipped = sorted(getattr(self.checker, "skipped_layers", {}))
            active = ", ".join(getattr(self.checker, "active_layers", ())) or "none"
            why = f"active: {active}" + (f"; skipped here: {', '.join(skipped)}" if skipped else "")
            for c in CHECKS:
                if c.kind == "runtime" and c.id not in _LIFECYCLE and c.id not in seen:
                    out.cannot_apply(c.id, f"no active detection layer sees it here ({why})")
        return out.merged()

    def close(self) -> None:
        """The end of the session: stop the step watchdog and remove its hang file (a step still pending is not
        read: call `finish` first)."""
        self._pending = self._prepared = None
        if self._watchdog is not None:
            self._watchdog.close()

    # ---- one step --------------------------------------------------------------------------------------------
    def execute(self, step: Step, index: int) -> StepResult:
        """Run one step and check it, and return its result. Raises `ContextPoisoned` once a fault or hang left the
        process unusable, `EnvironmentUnavailable` for an explicit environment cause, `InvalidArgument` for a step
        outside the target's capacity; every error of the code under test is a finding in the result."""
        if self._pending is not None or self._prepared is not None:
            raise InvalidArgument("execute() while a submitted step is pending: call finish() first")
        done = self.submit(step, index) + self.finish()
        return done[-1][1]

    def submit(self, step: Step, index: int) -> list[tuple[int, StepResult]]:
        """`prepare` step `index`, then `launch` it; returns what `prepare` completed."""
        done = self.prepare(step, index)
        self.launch()
        return done

    def prepare(self, step: Step, index: int) -> list[tuple[int, StepResult]]:
        """Prepare step `index` on the host (batch, layout; nothing on the device), then settle the step launched
        before it (`flashcheck.deferred`); `launch` runs it. Returns the results this call completed, in step order: the
        earlier step's, and this one's only if it ended at once (outside the target's input contract). When settling
        the earlier step poisoned the process, this step will not run: its result is absent and `poisoned` is set.
        Raises like `execute`."""
        if self.poisoned:
            raise ContextPoisoned(
                f"{self.target.name}: an earlier step faulted or hung and left this process unusable; restart it"
            )
        if self._prepared is not None:
            raise InvalidArgument("prepare() while a prepared step was not launched: call launch() first")
        spec = self.spec_for(step)
        self._validate(step, spec)
        name = f"{step.op} bs={spec.batch_size}" + (f" bucket={step.bucket}" if step.bucket else "")
        padded = spec.batch_size if step.op == "eager" else self._bucket(step, spec)
        contract = self._input_contract(spec)
        if contract is not None:  # the target declared this input outside its contract: a skip, counted
            done = self.finish()
            return done if self.poisoned else [*done, (index, StepResult([], None, rejected=contract))]
        # host preparation, while the device may still run the previous step's checks; no device work before the
        # previous step settled (a fault of its device work surfaces on the next CUDA call)
        layout = self.layout_for(step, pad_to=None if step.op == "eager" else padded, spec=spec)
        done = self.finish()
        if not self.poisoned:
            self._prepared = lambda: self._launch(step, index, spec, name, padded, layout)
        return done

    def launch(self) -> None:
        """Run the prepared step's target calls and queue its checks; they settle at the next `prepare` or at
        `finish`. Nothing when no step is prepared (it ended at once, or will not run)."""
        run, self._prepared = self._prepared, None
        if run is not None:
            run()

    def _launch(self, step: Step, index: int, spec: BatchSpec, name: str, padded: int, layout: PagedLayout) -> None:
        loc = Location(target=self.target.name, step=index, step_name=name)
        self._last_region = None
        # the first step of each kind in a process pays for lazy imports and kernel JIT compiles: a longer leash
        warm = warms_up(step.op)
        _WARMED.add(step.op)
        label = f"step {index} ({name}) of {self.target.name}"
        pending = Pending(index, name, label, warm, loc, step.op, spec, padded, [], None)
        self._pending = pending

        def launch() -> list[Finding]:
            q = self.queries(spec, step.seed)
            try:
                if step.op == "eager":
                    found = self._eager(spec, index, name, loc, layout, q)
                elif step.op == "capture":
                    found = self._capture(step, spec, padded, index, name, loc, layout, q)
                else:
                    found = self._replay(step, spec, padded, index, name, loc, layout, q)
            except _TargetRaised as raised:
                found = [self._target_error(raised.exc, loc)]
            if not self.poisoned:  # the step's one transfer: the arena scan and the comparisons' screens
                with self.checker.checker_read():
                    pending.probe = self.checker.arena.probe()
                    flags = [f for s in pending.screens for f in s.flags if f is not None]
                    pending.transfer = Transfer(self._torch, [*pending.probe.results, *flags])
            return found

        t0 = time.monotonic()
        pending.findings = self._guarded(label, warm, loc, launch)
        pending.launched = time.monotonic()
        pending.spent = pending.launched - t0
        pending.last_region = self._last_region
        self.steps_run += 1

    def finish(self) -> list[tuple[int, StepResult]]:
        """Settle the launched step, if any: read its device-side checks and return its result."""
        if self._prepared is not None:
            raise InvalidArgument("finish() while a prepared step was not launched: call launch() first")
        p, self._pending = self._pending, None
        if p is None:
            return []
        if p.transfer is not None and not self.poisoned:
            self._last_region = p.last_region
            # under the step watchdog (what the launch left of its timeout) only where settling can block: a wait
            # for the device, a comparison to explain
            t0 = time.monotonic()
            wait = not p.transfer.ready() or p.transfer.blocking
            p.findings += self._guarded(p.label, p.warm, p.loc, lambda: self._read(p), watch=wait, spent=p.spent)
            p.spent += time.monotonic() - t0 if wait else 0.0
            if p.values is not None:
                screens = self._screens_set(p)
                p.findings += self._guarded(
                    p.label, p.warm, p.loc, lambda: self._settle(p, screens), watch=any(screens), spent=p.spent
                )
        findings = self._merge_detector_findings(p.findings, p.index, p.name)
        sample = Sample(
            t=time.perf_counter() - self.t0,
            step=p.index,
            op=p.op,
            target=self.target.name,
            batch_size=p.spec.batch_size,
            padded=p.padded,
            total_qo=p.spec.total_qo,
            total_kv=p.spec.total_kv,
            workspaces=p.usage,
            findings=tuple(f.id for f in findings),
            worker=self.worker,
        )
        return [(p.index, StepResult(findings, sample))]

    def pending_ready(self) -> bool:
        """Whether `finish` should run now: it would not wait for the device (also when nothing is pending), or the
        launched step has waited half its timeout, so that `finish` waits under the step watchdog."""
        p = self._pending
        if p is None or p.transfer is None or p.transfer.ready():
            return True
        wd = self._watchdog
        return wd is not None and time.monotonic() - p.launched > wd.timeout / 2

    def _read(self, p: Pending) -> list[Finding]:
        """Wait for a step's one transfer and keep its values."""
        assert p.transfer is not None
        with self.checker.checker_read():
            p.values = p.transfer.read()
        return []

    def _screens_set(self, p: Pending) -> list[bool]:
        """Per `Screened` of the step: is a screen set (or absent), so that its properties must run on the host?"""
        assert p.values is not None and p.probe is not None
        flags = iter(p.values[len(p.probe.results) :])
        read = [[f is None or bool(next(flags)[0]) for f in s.flags] for s in p.screens]  # every flag, in order
        return [any(r) for r in read]

    def _settle(self, p: Pending, screens: list[bool]) -> list[Finding]:
        """Run the comparisons whose screen is set, then account the arena scan (scanned again where an eager check
        ran after the probe, so that its writes are covered as before)."""
        assert p.values is not None and p.probe is not None
        found: list[Finding] = []
        values, n = p.values, len(p.probe.results)
        rescan = False
        for s, is_set in zip(p.screens, screens, strict=True):
            if is_set:
                got = self._compare(s.obs)
                rescan = rescan or (bool(got) and s.then is not None)
                found += s.then(got) if s.then is not None else got
            else:  # every screen ran on the device and passed: the properties were evaluated
                self._exercised.mark(*(prop.check.id for prop in properties(Phase.COMPARE)))
        with self.checker.checker_read():
            if rescan or self.poisoned:
                arena_found, p.usage = ([], {}) if self.poisoned else self.checker.arena.scan(p.index)
            else:
                rows = [[v[i : i + 3] for i in range(0, len(v), 3)] for v in values[:n]]
                arena_found, p.usage = self.checker.arena.account(p.probe, rows, p.index)
        if p.usage:
            self._exercised.mark(WORKSPACE_WITHIN_BOUNDS.id)
        elif not self.poisoned:
            self._exercised.cannot_apply(WORKSPACE_WITHIN_BOUNDS.id, _NO_WORKSPACE)
        return found + arena_found

    def _guarded(
        self,
        label: str,
        warm: bool,
        loc: Location,
        body: Callable[[], list[Finding]],
        *,
        watch: bool = True,
        spent: float = 0.0,
    ) -> list[Finding]:
        """`body` (under the step watchdog with `watch`, for what is left of the step's timeout after `spent`); a
        hang is FC252, a fault that surfaces in flashcheck's own reads is a late fault of the step's last target
        region, any other error of flashcheck's own propagates."""
        try:
            with self._watched(label, warm=warm, spent=spent) if watch else contextlib.nullcontext():
                return body()
        except StepHung:
            return [self._hang(loc.step if loc.step is not None else -1, loc.step_name or "")]
        except FlashcheckError:
            raise
        except Exception as exc:  # surfaced in flashcheck's own reads (reference, checks, scan) after target work
            cls = classify_exception(exc)
            if not cls.poisons_context:
                raise  # flashcheck's own bug: never disguised as a finding against the target
            self.poisoned = True
            return [self._late_fault(exc, cls, loc)]

    def _merge_detector_findings(self, findings: list[Finding], index: int, name: str) -> list[Finding]:
        """Add what the runtime detectors saw (the arena reports through scan() and, under a Checker, also
        through drain_findings(): keep one of each). After a fault the detectors' own reads may fail too."""
        try:
            drained = self.checker.drain_findings()
        except Exception:
            if not self.poisoned:
                raise
            drained = []

        def placed(f: Finding) -> Finding:
            f = f if f.location.target else f.with_location(target=self.target.name)
            return f if f.location.step is not None else f.with_location(step=index, step_name=name)

        out = [placed(f) for f in findings]
        seen = {f.signature() for f in out}
        for f in map(placed, drained):
            if f.signature() not in seen:
                seen.add(f.signature())
                out.append(f)
        return out

    # ---- contracts -------------------------------------------------------------------------------------------
    def _input_contract(self, spec: BatchSpec) -> str | None:
        accepts = getattr(self.target, "accepts", None)
        if accepts is None:
            return None
        reason = accepts(spec)
        return None if reason is None else f"outside {self.target.name}'s declared input contract: {reason}"

    def _bucket(self, step: Step, spec: BatchSpec) -> int:
        bucket = step.bucket if step.bucket is not None else self.cap.bucket_for(spec.batch_size)
        if bucket is None or bucket not in self.cap.buckets:
            raise InvalidArgument(
                f"step {step.op} needs a graph bucket >= batch size {spec.batch_size}; target {self.target.name} "
                f"captures {list(self.cap.buckets) or 'no graphs'}"
            )
        if bucket < spec.batch_size:
            raise InvalidArgument(f"bucket {bucket} is smaller than the batch size {spec.batch_size}")
        return bucket

    def _validate(self, step: Step, spec: BatchSpec) -> None:
        c = self.cap
        problems = []
        if spec.batch_size > c.max_batch_size:
            problems.append(f"batch size {spec.batch_size} > max_batch_size {c.max_batch_size}")
        if max(spec.qo_lens) > c.max_qo_len:
            problems.append(f"qo_len {max(spec.qo_lens)} > max_qo_len {c.max_qo_len}")
        if max(spec.kv_lens) > c.max_kv_len:
            problems.append(f"kv_len {max(spec.kv_lens)} > max_kv_len {c.max_kv_len}")
        if spec.num_pages_needed + 1 > c.max_pages:
            problems.append(f"{spec.num_pages_needed} pages > pool of {c.max_pages - 1}")
        if spec.total_qo > c.max_total_qo:
            problems.append(f"{spec.total_qo} query rows > max_total_qo {c.max_total_qo}")
        if problems:
            raise InvalidArgument(
                f"step {step.to_dict()} does not fit target {self.target.name}: {'; '.join(problems)}"
            )
