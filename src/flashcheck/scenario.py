"""Scenarios (sequences of steps) and the driver that runs them against a target, checking every property.

A `Scenario` is JSON: the target, its configuration, the seed and the steps (``eager``, ``capture``,
``replay``). The `Driver` owns the KV cache and the queries (both seeded), opens a region around every target call,
and after each step checks: FC301 on the persistent buffers a graph reads (just before replay), FC304 plan_info
stability, FC303 (every output against the fp32 reference on the device; a failed replay screen is explained by a
fresh eager run), the arena's FC302, and whatever the runtime checker's detectors saw (FC2xx). Exceptions go
through the classification table.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from flashcheck.batch import BatchSpec
from flashcheck.errors import EnvironmentUnavailable, InvalidArgument, UsageError
from flashcheck.findings import Finding, Location
from flashcheck.layout import PaddingPolicy, PagedLayout, build_paged_layout
from flashcheck.properties.csr import check_csr, check_layout
from flashcheck.properties.equivalence import any_violation, compare_outputs, tolerance_for
from flashcheck.properties.plan_info import check_plan_info
from flashcheck.rundir import Sample
from flashcheck.runtime.api import CheckerLike, Region
from flashcheck.targets.classify import classify_exception, finding_from_exception
from flashcheck.targets.protocol import Target, TargetEnv

__all__ = ["Driver", "Scenario", "Step", "StepOp", "StepResult"]

_POOL_ROWS, _POOL_SLACK = 2048, 512  # query pool: rows for the largest batch (capped) + room for distinct windows

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
    findings: list[Finding]
    sample: Sample | None
    rejected: str | None = None


class Driver:
    """Runs steps against a target under a checker. Create, `setup()`, then `execute()` each step."""

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
    ) -> None:
        self.target = target
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
        self._torch: Any = None
        self._q_pool: Any = None
        self._graphed_ref: Any = None

    # ---- setup -----------------------------------------------------------------------------------------------
    def setup(self) -> None:
        import torch

        self._torch = torch
        tpl = self.cap.template
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        kv_dt = _torch_dtype(torch, tpl.kv_dtype)
        shape_k = (self.cap.max_pages, tpl.page_size, tpl.num_kv_heads, tpl.head_dim_qk)
        shape_v = (self.cap.max_pages, tpl.page_size, tpl.num_kv_heads, tpl.head_dim_vo)
        k = torch.randn(shape_k, generator=gen).to(kv_dt).to(self.device)
        if self.cap.value_from_key:  # MLA: V is ckv, the first head_dim_vo columns of K
            v = k[..., : tpl.head_dim_vo]
        else:
            v = torch.randn(shape_v, generator=gen).to(kv_dt).to(self.device)
        self.k_cache, self.v_cache = k, v
        with self.checker.region("plan", step_name="setup"):
            self.target.setup(TargetEnv(device=self.device, arena=self.checker.arena, k_cache=k, v_cache=v))

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
        dtype = _torch_dtype(torch, spec.q_dtype)
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
        if self.poisoned:
            raise EnvironmentUnavailable("the CUDA context was poisoned by an earlier kernel fault; restart the worker")
        spec = self.spec_for(step)
        self._validate(step, spec)
        name = f"{step.op} bs={spec.batch_size}" + (f" bucket={step.bucket}" if step.bucket else "")
        loc = Location(target=self.target.name, step=index, step_name=name)
        findings: list[Finding] = []
        usage: dict[str, tuple[int, int]] = {}
        padded = spec.batch_size if step.op == "eager" else self._bucket(step, spec)
        try:
            if step.op == "eager":
                findings += self._eager(step, spec, index, name, loc)
            elif step.op == "capture":
                findings += self._capture(step, spec, padded, index, name, loc)
            else:
                findings += self._replay(step, spec, padded, index, name, loc)
        except _TargetRaised as raised:  # every target error goes through the classification table
            exc = raised.exc
            cls = classify_exception(exc)
            if cls.verdict == "rejected":
                return StepResult([], None, rejected=f"{type(exc).__name__}: {exc}")
            if cls.verdict == "environment":
                raise EnvironmentUnavailable(f"{self.target.name}: {cls.reason}: {exc}") from exc
            if cls.check_id == "FC250" and "CUDA context" in cls.reason:
                self.poisoned = True
            findings.append(finding_from_exception(exc, cls, loc))
        with self.checker.checker_read():
            arena_findings, usage = self.checker.arena.scan(index)
        # the arena reports through scan() and, under a Checker, also through drain_findings(): keep one of each
        seen = {f.signature() for f in findings}
        for raw in [*arena_findings, *self.checker.drain_findings()]:
            f = raw if raw.location.target else raw.with_location(target=self.target.name)
            if f.location.step is None:
                f = f.with_location(step=index, step_name=name)
            if f.signature() not in seen:
                seen.add(f.signature())
                findings.append(f)
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
        self.checker.arena.arm()
        with self._call("plan", index, name):
            self.target.plan(layout)
        with self._call("run", index, name):
            out = self.target.run(q)
        out_f = check_layout(layout, location=loc)
        if self.check_reference:
            out_f += self._compare(out, self._reference(q, layout), "eager vs reference", layout, loc)
        return out_f

    def _capture(self, step: Step, spec: BatchSpec, bucket: int, index: int, name: str, loc: Location) -> list[Finding]:
        layout = self.layout_for(step, pad_to=bucket, spec=spec)
        q = self.queries(spec, step.seed)
        self.checker.arena.arm()
        with self._call("capture", index, name):
            self.target.capture(bucket, layout, q)
        with self.checker.checker_read(), self._call(None, index, name):
            self.captured[bucket] = self.target.plan_info(bucket)
        return check_layout(layout, location=loc)

    def _replay(self, step: Step, spec: BatchSpec, bucket: int, index: int, name: str, loc: Location) -> list[Finding]:
        found: list[Finding] = []
        if bucket not in self.captured:  # engines capture every bucket at start-up: do it implicitly
            found += self._capture(step, spec, bucket, index, f"capture bs={bucket} (implicit)", loc)
        layout = self.layout_for(step, pad_to=bucket, spec=spec)
        q = self.queries(spec, step.seed)
        self.checker.arena.arm()
        with self._call("prepare_replay", index, name):
            self.target.prepare_replay(bucket, layout)
        replay_loc = Location(target=loc.target, step=index, step_name=name, region="replay")
        csr: list[Finding] = []
        with self.checker.checker_read():
            with self._call(None, index, name):
                meta = self.target.graph_metadata(bucket)
                current = self.target.plan_info(bucket)
            if meta is not None:
                csr = check_csr(meta, location=replay_loc, prefix=f"graph bs={bucket}: ")
            captured = self.captured.get(bucket)
            if captured is not None and current is not None:
                found += check_plan_info(captured, current, bucket=bucket, location=replay_loc)
        found += csr
        if csr and not self.replay_malformed:
            # replaying malformed CSR can fault the kernel and poison the CUDA context for every later step
            return found
        with self._call("replay", index, name):
            out = self.target.replay(bucket, q)
        # `layout`'s real rows and pages are the unpadded batch's (same allocator seed): one reference serves both
        ref = self._reference(q, layout) if self.check_reference else None
        if ref is not None and not self._violates(out, ref, layout):
            return found  # within tolerance of the fp32 reference
        # no reference, or the replay failed its screen: a fresh eager run of the same batch tells a replay bug
        # ("replay vs eager") from a kernel or metadata that is wrong outside graphs too ("eager vs reference")
        out_host = self._host(out)  # the eager run may reuse the graph's output buffer
        eager_layout = self.layout_for(step, spec=spec)
        with self._call("plan", index, name + " (eager check)"):
            self.target.plan(eager_layout)
        with self._call("run", index, name + " (eager check)"):
            eager = self.target.run(q)
        found += self._compare(out_host, eager, "replay vs eager", eager_layout, replay_loc)
        if ref is not None:
            found += self._compare(eager, ref, "eager vs reference", eager_layout, replay_loc)
        return found

    # ---- helpers ---------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _call(self, region: Region | None, index: int, name: str) -> Iterator[None]:
        """Run target code inside `region`; its exceptions (not flashcheck's own) become `_TargetRaised`."""
        with contextlib.ExitStack() as stack:
            if region is not None:
                stack.enter_context(self.checker.region(region, step=index, step_name=name))
            try:
                yield
            except (EnvironmentUnavailable, UsageError):
                raise
            except Exception as exc:
                raise _TargetRaised(exc) from exc

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

    def _host(self, x: Any) -> Any:
        with self.checker.checker_read():
            if hasattr(x, "detach"):
                return x.detach().float().cpu().numpy()
            return np.asarray(x, dtype=np.float32)

    def _reference(self, q: Any, layout: PagedLayout) -> Any:
        """The fp32 reference output, on the device of the KV cache (no host copy until a comparison fails). On
        CUDA it is padded to power-of-two shapes and replayed as CUDA graphs (`reference.graphed`): its result is
        then a graph's static output, valid until the next call."""
        from flashcheck.reference.torch_ref import paged_attention_torch

        with self.checker.checker_read():
            if not str(self.device).startswith("cuda"):
                return paged_attention_torch(q, self.k_cache, self.v_cache, layout)
            if self._graphed_ref is None:
                from flashcheck.reference.graphed import GraphedReference

                self._graphed_ref = GraphedReference(self.k_cache, self.v_cache)
            return self._graphed_ref(q, layout)

    def _violates(self, got: Any, want: Any, layout: PagedLayout) -> bool:
        """Screen on the device: does a real row of `got` fail the FC303 tolerance test against `want`? One
        one-byte transfer; host arrays, or tensors of different shapes or devices, answer True (compare fully)."""
        if not (hasattr(got, "detach") and hasattr(want, "detach")):
            return True
        if tuple(got.shape) != tuple(want.shape) or got.device != want.device:
            return True
        tol = tolerance_for(layout.spec.q_dtype, layout.spec.kv_dtype)
        with self.checker.checker_read():
            return bool(any_violation(got, want, tol=tol, rows=layout.real_qo_rows()).item())

    def _compare(self, got: Any, want: Any, what: str, layout: PagedLayout, loc: Location) -> list[Finding]:
        if not self._violates(got, want, layout):
            return []
        rows = layout.real_qo_rows()
        g = self._host(got)[:rows]
        w = self._host(want)[:rows]  # on the GPU both stay on the device until a screen fails
        row_to_req = np.repeat(np.arange(layout.batch_size), np.diff(layout.qo_indptr[: layout.batch_size + 1]))
        tol = tolerance_for(layout.spec.q_dtype, layout.spec.kv_dtype)
        return compare_outputs(g, w, tol=tol, what=what, row_to_request=row_to_req, location=loc)


class _TargetRaised(Exception):
    """Carries an exception raised by the code under test (as opposed to one of flashcheck's own)."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


def _torch_dtype(torch: Any, name: str) -> Any:
    return getattr(torch, name)


def run_steps(driver: Driver, steps: Sequence[Step]) -> list[StepResult]:
    """Execute steps in order (a convenience for tests and reproducers)."""
    return [driver.execute(s, i) for i, s in enumerate(steps)]
