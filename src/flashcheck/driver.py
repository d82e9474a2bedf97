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
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from flashcheck.batch import BatchSpec
from flashcheck.campaign.checks import WORKER_CRASHED

# the catalogue by its own name, never ``from flashcheck import catalogue``: that takes the package's attribute, which
# can be a module sys.modules no longer holds (an in-process pytest run, pytester's, removes from sys.modules what it
# imported but leaves the package's attribute); its properties then declare the phases of a `Phase` class that is no
# longer this module's, and no property would ever run
from flashcheck.catalogue import CHECKS, PROPERTIES, properties
from flashcheck.errors import (
    ContextPoisoned,
    EnvironmentUnavailable,
    FlashcheckError,
    InvalidArgument,
    ViolationFound,
)
from flashcheck.exercised import Exercised
from flashcheck.findings import Finding, Location
from flashcheck.layout import PaddingPolicy, PagedLayout, build_paged_layout
from flashcheck.pressure import AsyncPressure
from flashcheck.properties.phases import AfterPlan, BeforeReplay, Compare, OnOutput, Phase
from flashcheck.rundir import Sample
from flashcheck.runtime.api import CheckerLike, Region
from flashcheck.runtime.checks.workspace import WORKSPACE_WITHIN_BOUNDS
from flashcheck.runtime.hooks import PRESETS
from flashcheck.scenario import Step, StepResult
from flashcheck.targets.classify import TARGET_RAISED, classify_exception, finding_from_exception
from flashcheck.targets.protocol import Target, TargetEnv
from flashcheck.watchdog import STEP_HUNG, StepHung, Watchdog, hang_finding

__all__ = ["Driver", "checks_run"]

_LIFECYCLE = frozenset({TARGET_RAISED.id, STEP_HUNG.id, WORKER_CRASHED.id})  # runtime checks of no detection layer
_NO_WORKSPACE = "the target holds no workspace from the checker's arena"
_NO_PHASE = {
    Phase.BEFORE_REPLAY: "the target captures no CUDA graphs (no buckets)",
    Phase.COMPARE: "the target captures no CUDA graphs and the session does not compare with the reference",
}

_POOL_ROWS, _POOL_SLACK = 2048, 512  # query pool: rows for the largest batch (capped) + room for distinct windows
WARM_UP_SCALE = 5.0  # the step timeout of the first eager, capture and replay step of a process, times this
_WARMED: set[str] = set()  # step kinds this process has run once (imports done, kernels compiled)


def warms_up(op: str) -> bool:
    """Whether the next step of kind `op` (eager, capture, replay) in this process is its first, which gets
    `WARM_UP_SCALE` times the step timeout: it pays for lazy imports and the backend's JIT compiles."""
    return op not in _WARMED


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


class Driver:
    """Runs steps against a target under a checker. Create, `setup()`, then `execute()` each step.

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
        warm_up_scale: the first eager, capture and replay step of the process may take this many timeouts (lazy
            imports, kernel JIT compiles).
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
        """The end of the session: stop the step watchdog and remove its hang file."""
        if self._watchdog is not None:
            self._watchdog.close()

    # ---- one step --------------------------------------------------------------------------------------------
    def spec_for(self, step: Step) -> BatchSpec:
        return self.cap.template.with_lengths(step.qo_lens, step.kv_lens)

    def layout_for(self, step: Step, pad_to: int | None = None, spec: BatchSpec | None = None) -> PagedLayout:
        spec = spec or self.spec_for(step)
        pad = pad_to if pad_to is not None and pad_to > spec.batch_size else None
        return build_paged_layout(
            spec,
            num_pages=self.cap.max_pages,
            allocator=step.allocator if self.cap.paged else "contiguous",
            pad_to=pad,
            padding=self.cap.padding if pad else PaddingPolicy.NONE,
            seed=step.seed,
        )

    def queries(self, spec: BatchSpec, seed: int) -> Any:
        """Query rows for a batch: a seeded window of a random pool made once per session on the device (no
        per-step RNG or host-to-device copy). The rows depend only on the session seed, the capacity and `seed`."""
        torch = self._torch
        rows = spec.total_qo
        shape = (spec.num_qo_heads, spec.head_dim_qk)
        dtype = getattr(torch, spec.q_dtype)
        n = min(self.cap.max_total_qo, _POOL_ROWS) + _POOL_SLACK
        if rows > n:  # a batch larger than the pool: draw it directly
            gen = torch.Generator(device="cpu").manual_seed(seed ^ 0x5EED)
            return torch.randn((rows, *shape), generator=gen).to(dtype).to(self.device)
        pool = self._q_pool
        if pool is None or tuple(pool.shape[1:]) != shape or pool.dtype != dtype:
            gen = torch.Generator(device="cpu").manual_seed(self.seed ^ 0x5EED)
            pool = torch.randn((n, *shape), generator=gen).to(dtype).to(self.device)
            self._q_pool = pool
        start = int(np.random.default_rng(seed & 0xFFFFFFFF).integers(0, n - rows + 1))
        return pool[start : start + rows].clone()

    def execute(self, step: Step, index: int) -> StepResult:
        """Run one step and check it. Raises `ContextPoisoned` once a fault or hang left the process unusable,
        `EnvironmentUnavailable` for an explicit environment cause, `InvalidArgument` for a step outside the
        target's capacity; every error of the code under test is a finding in the result."""
        if self.poisoned:
            raise ContextPoisoned(
                f"{self.target.name}: an earlier step faulted or hung and left this process unusable; restart it"
            )
        spec = self.spec_for(step)
        self._validate(step, spec)
        name = f"{step.op} bs={spec.batch_size}" + (f" bucket={step.bucket}" if step.bucket else "")
        padded = spec.batch_size if step.op == "eager" else self._bucket(step, spec)
        contract = self._input_contract(spec)
        if contract is not None:  # the target declared this input outside its contract: a skip, counted
            return StepResult([], None, rejected=contract)
        loc = Location(target=self.target.name, step=index, step_name=name)
        self._last_region = None
        findings: list[Finding] = []
        usage: dict[str, tuple[int, int]] = {}
        # the first step of each kind in a process pays for lazy imports and kernel JIT compiles: a longer leash
        warm = warms_up(step.op)
        _WARMED.add(step.op)
        try:
            with self._watched(f"step {index} ({name}) of {self.target.name}", warm=warm):
                try:
                    if step.op == "eager":
                        findings += self._eager(step, spec, index, name, loc)
                    elif step.op == "capture":
                        findings += self._capture(step, spec, padded, index, name, loc)
                    else:
                        findings += self._replay(step, spec, padded, index, name, loc)
                except _TargetRaised as raised:
                    findings.append(self._target_error(raised.exc, loc))
                if not self.poisoned:
                    with self.checker.checker_read():
                        arena_findings, usage = self.checker.arena.scan(index)
                    findings += arena_findings
                    if usage:
                        self._exercised.mark(WORKSPACE_WITHIN_BOUNDS.id)
                    else:
                        self._exercised.cannot_apply(WORKSPACE_WITHIN_BOUNDS.id, _NO_WORKSPACE)
        except StepHung:
            findings.append(self._hang(index, name))
        except FlashcheckError:
            raise
        except Exception as exc:  # surfaced in flashcheck's own reads (reference, checks, scan) after target work
            cls = classify_exception(exc)
            if not cls.poisons_context:
                raise  # flashcheck's own bug: never disguised as a finding against the target
            self.poisoned = True
            findings.append(self._late_fault(exc, cls, loc))
        self.steps_run += 1
        findings = self._merge_detector_findings(findings, index, name)
        sample = Sample(
            t=time.perf_counter() - self.t0,
            step=index,
            op=step.op,
            target=self.target.name,
            batch_size=spec.batch_size,
            padded=padded,
            total_qo=spec.total_qo,
            total_kv=spec.total_kv,
            workspaces=usage,
            findings=tuple(f.id for f in findings),
            worker=self.worker,
        )
        return StepResult(findings, sample)

    # ---- the three operations --------------------------------------------------------------------------------
    def _eager(self, step: Step, spec: BatchSpec, index: int, name: str, loc: Location) -> list[Finding]:
        layout = self.layout_for(step, spec=spec)
        q = self.queries(spec, step.seed)
        ref = self._reference(q, layout) if self.check_reference else None  # queued first: see `_reference`
        self.checker.arena.arm()
        self.pressure.before_host_prep()
        with self._call("plan", index, name):
            self.target.plan(layout)
        with self._call("run", index, name):
            out = self.target.run(q)
        found, _ = self._properties(Phase.AFTER_PLAN, AfterPlan(layout, loc))
        contract, blocked = self._properties(Phase.ON_OUTPUT, OnOutput(out, layout, "eager", self.device, loc))
        found += contract
        if blocked:
            return found
        if ref is not None:
            found += self._compare(out, ref, "eager vs reference", layout, loc)
        return found

    def _capture(self, step: Step, spec: BatchSpec, bucket: int, index: int, name: str, loc: Location) -> list[Finding]:
        layout = self.layout_for(step, pad_to=bucket, spec=spec)
        q = self.queries(spec, step.seed)
        self.checker.arena.arm()
        with self._call("capture", index, name):
            self.target.capture(bucket, layout, q)
        with self.checker.checker_read(), self._call(None, index, name):
            self.captured[bucket] = self.target.plan_info(bucket)
        return self._properties(Phase.AFTER_PLAN, AfterPlan(layout, loc))[0]

    def _replay(self, step: Step, spec: BatchSpec, bucket: int, index: int, name: str, loc: Location) -> list[Finding]:
        found: list[Finding] = []
        if bucket not in self.captured:  # engines capture every bucket at start-up: do it implicitly
            found += self._capture(step, spec, bucket, index, f"capture bs={bucket} (implicit)", loc)
        layout = self.layout_for(step, pad_to=bucket, spec=spec)
        q = self.queries(spec, step.seed)
        # `layout`'s real rows and pages are the unpadded batch's (same allocator seed): one reference serves the
        # replay and the eager check; queued first (see `_reference`)
        ref = self._reference(q, layout) if self.check_reference else None
        self.checker.arena.arm()
        self.pressure.before_host_prep()
        with self._call("prepare_replay", index, name):
            self.target.prepare_replay(bucket, layout)
        replay_loc = Location(target=loc.target, step=index, step_name=name, region="replay")
        with self.checker.checker_read(), self._call(None, index, name):
            meta = self.target.graph_metadata(bucket)
            current = self.target.plan_info(bucket)
        before = BeforeReplay(bucket, meta, self.captured.get(bucket), current, replay_loc)
        pre, blocked = self._properties(Phase.BEFORE_REPLAY, before)
        found += pre
        if blocked and not self.replay_malformed:
            return found
        with self._call("replay", index, name):
            out = self.target.replay(bucket, q)
        contract, blocked = self._properties(Phase.ON_OUTPUT, OnOutput(out, layout, "replay", self.device, replay_loc))
        found += contract
        if blocked:
            return found
        if ref is not None and not self._compare(out, ref, "replay vs reference", layout, replay_loc):
            return found  # the replay agrees with the fp32 reference
        # no reference, or the replay disagrees with it: a fresh eager run of the same batch tells a replay bug
        # ("replay vs eager") from a kernel or metadata that is wrong outside graphs too ("eager vs reference")
        out_host = self._host(out)  # the eager run may reuse the graph's output buffer
        eager_layout = self.layout_for(step, spec=spec)
        with self._call("plan", index, name + " (eager check)"):
            self.target.plan(eager_layout)
        with self._call("run", index, name + " (eager check)"):
            eager = self.target.run(q)
        contract, blocked = self._properties(
            Phase.ON_OUTPUT, OnOutput(eager, eager_layout, "eager", self.device, replay_loc)
        )
        found += contract
        if blocked:
            return found
        found += self._compare(out_host, eager, "replay vs eager", eager_layout, replay_loc)
        if ref is not None:
            found += self._compare(eager, ref, "eager vs reference", eager_layout, replay_loc)
        return found

    # ---- error boundaries ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _call(self, region: Region | None, index: int, name: str) -> Iterator[None]:
        """Run target code inside `region`; its exceptions, and on CUDA the faults of the kernels it launched
        (surfaced by a synchronize before the boundary closes), become `_TargetRaised`."""
        with contextlib.ExitStack() as stack:
            if region is not None:
                self._last_region = (region, name)
                stack.enter_context(self.checker.region(region, step=index, step_name=name))
            try:
                yield
                self._sync()
            except (FlashcheckError, StepHung):
                raise
            except Exception as exc:
                raise _TargetRaised(exc) from exc

    def _sync(self) -> None:
        """Wait for the work just launched, as the checker's own read (never an FC201 of the target)."""
        if self._cuda and self._torch is not None:
            with self.checker.checker_read():
                self._torch.cuda.synchronize()

    @contextlib.contextmanager
    def _watched(self, label: str, *, warm: bool) -> Iterator[None]:
        if self._watchdog is None:
            yield
            return
        self._watchdog.arm(label, scale=self.warm_up_scale if warm else 1.0)
        self._exercised.mark(STEP_HUNG.id)
        try:
            yield
        finally:
            self._watchdog.disarm()

    def _target_error(self, exc: Exception, loc: Location) -> Finding:
        cls = classify_exception(exc)
        if cls.verdict == "environment" and not self.poisoned:
            raise EnvironmentUnavailable(f"{self.target.name}: {cls.reason}: {exc}") from exc
        if cls.poisons_context:
            self.poisoned = True
        region = self._last_region[0] if self._last_region else None
        return finding_from_exception(exc, cls, dataclasses.replace(loc, region=region))

    def _late_fault(self, exc: Exception, cls: Any, loc: Location) -> Finding:
        region, name = self._last_region or (None, loc.step_name or "")
        f = finding_from_exception(exc, cls, dataclasses.replace(loc, region=region))
        where = f"after `{region}` ({name})" if region else "before any target call returned"
        return dataclasses.replace(
            f,
            message=f"{f.message} (surfaced in flashcheck's own reads {where})",
            evidence={**dict(f.evidence), "surfaced": "flashcheck read", "after_region": region},
        )

    def _hang(self, index: int, name: str) -> Finding:
        wd = self._watchdog
        assert wd is not None
        # the kernel may still be running, and the interrupt may have landed inside library code (an import, a
        # lock): nothing else should run in this process
        self.poisoned = True
        region = self._last_region[0] if self._last_region else None
        return hang_finding(
            target=self.target.name, step=index, step_name=name, timeout=wd.limit, stacks=wd.stacks, region=region
        )

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

    # ---- reads -----------------------------------------------------------------------------------------------
    def _host(self, x: Any) -> Any:
        with self.checker.checker_read():
            if hasattr(x, "detach"):
                return x.detach().float().cpu().numpy()
            return np.asarray(x, dtype=np.float32)

    def _reference(self, q: Any, layout: PagedLayout) -> Any:
        """The fp32 reference output, on the device of the KV cache (no host copy until a comparison fails). On
        CUDA it is padded to power-of-two shapes and replayed as CUDA graphs (`reference.graphed`): its result is
        then a graph's static output, valid until the next call. A step queues it before the target's first call:
        it depends only on the queries and the KV cache, so the device computes it while the host runs the
        target's plan, and the output screen then waits only for the target's own kernels."""
        from flashcheck.reference.torch_ref import paged_attention_torch

        with self.checker.checker_read():
            if not self._cuda:
                return paged_attention_torch(q, self.k_cache, self.v_cache, layout)
            if self._graphed_ref is None:
                from flashcheck.reference.graphed import GraphedReference

                self._graphed_ref = GraphedReference(self.k_cache, self.v_cache)
            return self._graphed_ref(q, layout)

    def _compare(self, got: Any, want: Any, what: str, layout: PagedLayout, loc: Location) -> list[Finding]:
        """The properties of two outputs that must agree (FC303 screens on the device and copies to the host only
        to explain a disagreement)."""
        return self._properties(Phase.COMPARE, Compare(got, want, what, layout, loc))[0]

    def _properties(self, phase: Phase, observation: object) -> tuple[list[Finding], bool]:
        """Run every property of `phase` on `observation`, as the checker's own read (they may copy device buffers
        to the host); also whether a blocking property found something (the step must not go on with it)."""
        found: list[Finding] = []
        blocked = False
        with self.checker.checker_read():
            for prop in properties(phase):
                got = prop.run(observation)
                self._exercised.mark(prop.check.id)
                found += got
                blocked = blocked or (prop.blocks and bool(got))
        return found, blocked


class _TargetRaised(Exception):
    """Carries an exception raised by the code under test (as opposed to one of flashcheck's own)."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc
