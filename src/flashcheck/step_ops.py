"""What a driver step does, below its lifecycle (`flashcheck.driver`): the three operations (eager, capture,
replay) with the properties of each phase, the error boundary around every target call, the watchdog, and
flashcheck's own reads (the fp32 reference, host copies). `Driver` holds the state that these read.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from flashcheck.batch import BatchSpec

# the catalogue by its own name (see `flashcheck.driver`)
from flashcheck.catalogue import properties
from flashcheck.deferred import Pending, Screened
from flashcheck.errors import EnvironmentUnavailable, FlashcheckError
from flashcheck.exercised import Exercised
from flashcheck.findings import Finding, Location
from flashcheck.layout import PaddingPolicy, PagedLayout, build_paged_layout
from flashcheck.pressure import AsyncPressure
from flashcheck.properties.phases import AfterPlan, BeforeReplay, Compare, OnOutput, Phase
from flashcheck.runtime.api import CheckerLike, Region
from flashcheck.scenario import Step
from flashcheck.targets.classify import classify_exception, finding_from_exception
from flashcheck.targets.protocol import Capacity, Target
from flashcheck.watchdog import STEP_HUNG, StepHung, Watchdog, hang_finding

__all__ = ["StepOps"]

_POOL_ROWS, _POOL_SLACK = 2048, 512  # query pool: rows for the largest batch (capped) + room for distinct windows


class StepOps:
    """The operations of a step and their error boundaries; `flashcheck.driver.Driver` sets the state."""

    target: Target
    checker: CheckerLike
    cap: Capacity
    device: str
    seed: int
    check_reference: bool
    replay_malformed: bool
    warm_up_scale: float
    pressure: AsyncPressure
    captured: dict[int, list[int] | None]
    poisoned: bool
    k_cache: Any
    v_cache: Any
    _cuda: bool
    _torch: Any
    _q_pool: Any
    _graphed_ref: Any
    _last_region: tuple[Region, str] | None
    _watchdog: Watchdog | None
    _exercised: Exercised
    _pending: Pending | None

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

    # ---- the three operations --------------------------------------------------------------------------------
    def _eager(
        self, spec: BatchSpec, index: int, name: str, loc: Location, layout: PagedLayout, q: Any
    ) -> list[Finding]:
        ref = self._reference(q, layout) if self.check_reference else None  # before the target: see `_reference`
        self.checker.arena.arm()
        self.pressure.before_host_prep()
        with self._call("plan", index, name):
            self.target.plan(layout)
        with self._call("run", index, name):
            out = self.target.run(q)
        found, _ = self._properties(Phase.AFTER_PLAN, AfterPlan(layout, loc))
        contract, blocked = self._properties(Phase.ON_OUTPUT, OnOutput(out, layout, "eager", self.device, loc))
        found += contract
        if not blocked and ref is not None:
            self._compare_later(Compare(out, ref, "eager vs reference", layout, loc))
        return found

    def _capture(
        self,
        step: Step,
        spec: BatchSpec,
        bucket: int,
        index: int,
        name: str,
        loc: Location,
        layout: PagedLayout | None = None,
        q: Any = None,
    ) -> list[Finding]:
        layout = layout or self.layout_for(step, pad_to=bucket, spec=spec)
        q = q if q is not None else self.queries(spec, step.seed)
        self.checker.arena.arm()
        with self._call("capture", index, name):
            self.target.capture(bucket, layout, q)
        with self.checker.checker_read(), self._call(None, index, name):
            self.captured[bucket] = self.target.plan_info(bucket)
        return self._properties(Phase.AFTER_PLAN, AfterPlan(layout, loc))[0]

    def _replay(
        self,
        step: Step,
        spec: BatchSpec,
        bucket: int,
        index: int,
        name: str,
        loc: Location,
        layout: PagedLayout,
        q: Any,
    ) -> list[Finding]:
        found: list[Finding] = []
        if bucket not in self.captured:  # engines capture every bucket at start-up: do it implicitly
            found += self._capture(step, spec, bucket, index, f"capture bs={bucket} (implicit)", loc)
        # `layout`'s real rows and pages are the unpadded batch's (same allocator seed): one reference serves the
        # replay and the eager check; queued before the target's calls (see `_reference`)
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

        def explain(disagree: list[Finding]) -> list[Finding]:
            # the replay disagrees with the fp32 reference (or there is none): a fresh eager run of the same batch
            # tells a replay bug ("replay vs eager") from a kernel or metadata that is wrong outside graphs too
            return self._explain_replay(step, spec, out, ref, q, index, name, replay_loc) if disagree else []

        if ref is None:
            return found + explain([])  # pragma: no mutate (no reference: always explained)
        self._compare_later(Compare(out, ref, "replay vs reference", layout, replay_loc), explain)
        return found

    def _explain_replay(
        self, step: Step, spec: BatchSpec, out: Any, ref: Any, q: Any, index: int, name: str, loc: Location
    ) -> list[Finding]:
        found: list[Finding] = []
        out_host = self._host(out)  # the eager run may reuse the graph's output buffer
        eager_layout = self.layout_for(step, spec=spec)
        try:
            with self._call("plan", index, name + " (eager check)"):
                self.target.plan(eager_layout)
            with self._call("run", index, name + " (eager check)"):
                eager = self.target.run(q)
        except _TargetRaised as raised:
            return [self._target_error(raised.exc, loc)]
        contract, blocked = self._properties(Phase.ON_OUTPUT, OnOutput(eager, eager_layout, "eager", self.device, loc))
        found += contract
        if blocked:
            return found
        found += self._compare(Compare(out_host, eager, "replay vs eager", eager_layout, loc))
        if ref is not None:
            found += self._compare(Compare(eager, ref, "eager vs reference", eager_layout, loc))
        return found

    def _compare_later(self, obs: Compare, then: Callable[[list[Finding]], list[Finding]] | None = None) -> None:
        """Leave the comparison properties of `obs` to the step's settling: their device screens join the step's
        one transfer (`flashcheck.deferred`)."""
        assert self._pending is not None
        with self.checker.checker_read():
            flags = [p.screen(obs) if p.screen is not None else None for p in properties(Phase.COMPARE)]
        self._pending.screens.append(Screened(obs, flags, then))

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
            with self.checker.checker_read():  # the C call under torch.cuda.synchronize(): the same wait and
                self._torch._C._cuda_synchronize()  # trace event, without its device lookups (several per step)

    @contextlib.contextmanager
    def _watched(self, label: str, *, warm: bool, spent: float = 0.0) -> Iterator[None]:
        """Watch `label` for one step timeout (`warm_up_scale` of them when `warm`), less the seconds the step's
        earlier phases `spent` under the watchdog: the phases of a step (its launch, its settling) share one."""
        if self._watchdog is None:
            yield
            return
        scale = self.warm_up_scale if warm else 1.0
        self._watchdog.arm(label, scale=max(scale - spent / self._watchdog.timeout, 0.01))
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

    # ---- reads -----------------------------------------------------------------------------------------------
    def _host(self, x: Any) -> Any:
        with self.checker.checker_read():
            if hasattr(x, "detach"):
                return x.detach().float().cpu().numpy()
            return np.asarray(x, dtype=np.float32)

    def _reference(self, q: Any, layout: PagedLayout) -> Any:
        """The fp32 reference output, on the device of the KV cache (no host copy until a comparison fails). On
        CUDA it is padded to power-of-two shapes and replayed as CUDA graphs (`reference.graphed`): its result is
        then a graph's static output, valid until the next call. A step queues it before the target's first call,
        so that it reads the queries and the KV cache as they were before the target ran: a target that writes
        either in place still disagrees with it (queued after the target, it measured no faster: the device work of
        a step bounds it either way)."""
        from flashcheck.reference.torch_ref import paged_attention_torch

        with self.checker.checker_read():
            if not self._cuda:
                return paged_attention_torch(q, self.k_cache, self.v_cache, layout)
            if self._graphed_ref is None:
                from flashcheck.reference.graphed import GraphedReference

                self._graphed_ref = GraphedReference(self.k_cache, self.v_cache)
            return self._graphed_ref(q, layout)

    def _compare(self, obs: Compare) -> list[Finding]:
        """The properties of two outputs that must agree (FC303 screens on the device and copies to the host only
        to explain a disagreement)."""
        return self._properties(Phase.COMPARE, obs)[0]

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
