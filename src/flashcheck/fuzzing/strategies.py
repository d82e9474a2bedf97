"""Public Hypothesis strategies for serving batches, scenario steps, scenarios and head configurations.

Hypothesis draws only *parameters* (`LengthParams`: distribution, batch size, seed, length cap, edge-case switches);
`lengths_for` turns them into arrays with numpy in bulk, so a batch of 512 requests costs microseconds, not the
~3.7 ms per example that per-element list strategies cost. Every parameter shrinks toward the simplest batch: the
first distribution, one request, seed 0, the smallest length cap and no edge cases.

Example::

    from hypothesis import given
    from flashcheck.fuzzing.strategies import batch_specs, templates

    @given(batch_specs(templates(page_sizes=(16,)), max_batch=64))
    def test_layout(spec): ...
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
from hypothesis import strategies as st

from flashcheck.batch import BatchSpec, DType
from flashcheck.errors import InvalidArgument
from flashcheck.fuzzing.distributions import DISTRIBUTIONS, sample_lengths
from flashcheck.fuzzing.scenarios import fit_lengths
from flashcheck.layout import PaddingPolicy
from flashcheck.scenario import Scenario, Step, StepOp
from flashcheck.targets.protocol import Capacity, Target

__all__ = [
    "ALLOCATORS",
    "EDGE_CASES",
    "EdgeCase",
    "LengthParams",
    "batch_sizes",
    "batch_specs",
    "burst_params",
    "capacity_for",
    "capture_params",
    "length_params",
    "lengths_for",
    "padding_policies",
    "scenarios",
    "steps",
    "templates",
]

EdgeCase = Literal["page_boundary", "single_token", "max_kv", "full_pool"]
EDGE_CASES: tuple[EdgeCase, ...] = get_args(EdgeCase)
ALLOCATORS: tuple[str, ...] = ("contiguous", "shuffled", "fragmented")
_SEED_MAX = (1 << 32) - 1


@dataclass(frozen=True)
class LengthParams:
    """The drawn parameters of one batch; `lengths_for` turns them into arrays.

    Attributes:
        distribution: a name from `flashcheck.fuzzing.distributions.DISTRIBUTIONS`.
        batch_size: real requests.
        seed: numpy seed of the arrays.
        kv_cap: upper bound of the generated kv lengths (edge cases may go to the target's limit).
        edges: edge cases applied on top of the distribution:
            ``page_boundary`` (about half the rows get ``k * page_size`` and ±1), ``single_token`` (some rows get
            qo = kv = 1), ``max_kv`` (one row gets the target's ``max_kv_len``), ``full_pool`` (lengths scaled up
            until the page pool is nearly full).
    """

    distribution: str
    batch_size: int
    seed: int
    kv_cap: int
    edges: frozenset[str] = frozenset()

    def __repr__(self) -> str:  # printed in every failing Hypothesis program: keep it one short line
        e = f", edges={sorted(self.edges)}" if self.edges else ""
        return f"LengthParams({self.distribution!r}, bs={self.batch_size}, seed={self.seed}, kv_cap={self.kv_cap}{e})"


def capacity_for(template: BatchSpec, *, max_batch: int = 32, max_kv: int = 4096, max_qo: int = 64) -> Capacity:
    """A `Capacity` for a bare template (no target): a page pool big enough for `max_batch` x `max_kv`."""
    if max_batch < 1 or max_kv < 1 or max_qo < 1:
        raise InvalidArgument(f"max_batch, max_kv and max_qo must be >= 1, got {max_batch}, {max_kv}, {max_qo}")
    pages = max_batch * -(-max_kv // template.page_size) + 2
    return Capacity(template=template, max_batch_size=max_batch, max_pages=pages, max_qo_len=max_qo, max_kv_len=max_kv)


def lengths_for(cap: Capacity, p: LengthParams) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(qo_lens, kv_lens)`` for the drawn parameters, generated in bulk and fitted into `cap`."""
    page = cap.template.page_size
    qo, kv = sample_lengths(p.distribution, p.batch_size, p.seed, max_kv=max(8, p.kv_cap), page_size=page)
    if p.edges:
        rng = np.random.default_rng(p.seed ^ 0xED6E)
        n = p.batch_size
        if "page_boundary" in p.edges:
            k = rng.integers(1, max(2, min(p.kv_cap, cap.max_kv_len) // page + 1), n)
            snapped = np.maximum(1, k * page + rng.integers(-1, 2, n))
            kv = np.where(rng.random(n) < 0.5, snapped, kv)
        if "single_token" in p.edges:
            one = rng.random(n) < 0.3
            qo, kv = np.where(one, 1, qo), np.where(one, 1, kv)
        if "full_pool" in p.edges:
            budget_tokens = (cap.max_pages - 2 - n) * page
            if budget_tokens > 0 and kv.sum() > 0:
                kv = np.floor(kv * (budget_tokens / float(kv.sum()))).astype(np.int64)
                kv = np.clip(kv, 1, cap.max_kv_len)
        if "max_kv" in p.edges:
            kv[int(rng.integers(n))] = cap.max_kv_len
    return fit_lengths(cap, qo, kv)


def _kv_caps(cap: Capacity) -> list[int]:
    """Ascending caps (so shrinking goes to short sequences): 8, 32, 128, ... up to the target's max_kv_len."""
    page = cap.template.page_size
    per_req = max(8, (cap.max_pages - 2) * page // max(1, cap.max_batch_size))
    top = max(8, min(cap.max_kv_len, per_req))
    caps = [c for c in (8, 32, 128, 512, 2048, 8192, 32768, 131072) if c < top]
    return [*caps, top]


def batch_sizes(cap: Capacity, *, min_batch: int = 1, max_batch: int | None = None) -> st.SearchStrategy[int]:
    """Batch sizes in ``[min_batch, max_batch]`` with the edges drawn on purpose: 1, every bucket, one above each
    bucket (the most padded rows in the next bucket) and the target's largest batch."""
    hi = cap.max_batch_size if max_batch is None else max_batch
    if not 1 <= min_batch <= hi:
        raise InvalidArgument(f"need 1 <= min_batch <= max_batch, got {min_batch}, {hi}")
    edges = {1, hi, min_batch}
    for b in cap.buckets:
        edges.update((b, b + 1))
    special = sorted(e for e in edges if min_batch <= e <= hi)
    return st.one_of(st.integers(min_batch, hi), st.sampled_from(special))


def length_params(
    cap: Capacity,
    *,
    distributions: Sequence[str] = DISTRIBUTIONS,
    min_batch: int = 1,
    max_batch: int | None = None,
    edge_cases: Iterable[str] = EDGE_CASES,
    sizes: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy[LengthParams]:
    """Draws `LengthParams` for `cap`; pass `sizes` to control the batch size (e.g. ``st.integers(1, bucket)``)."""
    dists = _check_names("distribution", distributions, DISTRIBUTIONS)
    edges = _check_names("edge case", edge_cases, EDGE_CASES, allow_empty=True)
    size_st = sizes if sizes is not None else batch_sizes(cap, min_batch=min_batch, max_batch=max_batch)
    edge_st: st.SearchStrategy[frozenset[str]] = (
        st.frozensets(st.sampled_from(edges), max_size=len(edges)) if edges else st.just(frozenset())
    )
    return st.builds(
        LengthParams,
        st.sampled_from(dists),
        size_st,
        st.integers(0, _SEED_MAX),
        st.sampled_from(_kv_caps(cap)),
        edge_st,
    )


def capture_params(cap: Capacity, **kw: Any) -> st.SearchStrategy[tuple[int, LengthParams]]:
    """``(bucket, params)`` of a graph capture: a bucket of `cap` and a batch of at most its size. Shrinks toward the
    smallest bucket. Keyword arguments go to `length_params`. (One fixed strategy per bucket, not a ``flatmap``:
    a flatmap builds and validates a new strategy on every draw, milliseconds each.)"""
    if not cap.buckets:
        raise InvalidArgument("capture_params() needs a capacity with graph buckets")
    return st.one_of([st.tuples(st.just(b), length_params(cap, sizes=st.integers(1, b), **kw)) for b in cap.buckets])


def burst_params(cap: Capacity, p: LengthParams, i: int) -> LengthParams:
    """The `i`-th batch after `p` in a burst of replays through `p`'s bucket (serving steps between two captures):
    same distribution, length cap and edge cases, seed ``p.seed + i``, and a batch size drawn with numpy that the
    same bucket serves (above the next smaller bucket). ``i == 0`` is `p` itself."""
    if i == 0:
        return p
    bucket = cap.bucket_for(p.batch_size) or p.batch_size
    below = max([b for b in cap.buckets if b < bucket], default=0)
    seed = (p.seed + i) & _SEED_MAX
    size = int(np.random.default_rng(seed ^ 0xB0257).integers(below + 1, bucket + 1))
    return LengthParams(p.distribution, size, seed, p.kv_cap, p.edges)


def batch_specs(
    capacity: Capacity | BatchSpec | st.SearchStrategy[BatchSpec],
    *,
    distributions: Sequence[str] = DISTRIBUTIONS,
    min_batch: int = 1,
    max_batch: int | None = None,
    max_kv: int = 4096,
    edge_cases: Iterable[str] = EDGE_CASES,
) -> st.SearchStrategy[BatchSpec]:
    """`BatchSpec` values: a target's `Capacity`, a fixed template, or a strategy of templates (e.g. `templates()`).

    With a template, the page pool is sized for ``max_batch`` (default 32) requests of up to `max_kv` tokens.
    Lengths always fit the capacity (kv <= max_kv_len, pages fit the pool, qo <= max_qo_len).
    """
    if isinstance(capacity, st.SearchStrategy):
        tpl_st: st.SearchStrategy[BatchSpec] = capacity
        return tpl_st.flatmap(
            lambda t: batch_specs(
                t,
                distributions=distributions,
                min_batch=min_batch,
                max_batch=max_batch,
                max_kv=max_kv,
                edge_cases=edge_cases,
            )
        )
    if isinstance(capacity, BatchSpec):
        cap = capacity_for(capacity, max_batch=max_batch or 32, max_kv=max_kv)
    elif isinstance(capacity, Capacity):
        cap = capacity
    else:
        raise InvalidArgument(f"batch_specs() takes a Capacity, a BatchSpec or a strategy, got {capacity!r:.80}")
    params = length_params(
        cap, distributions=distributions, min_batch=min_batch, max_batch=max_batch, edge_cases=edge_cases
    )
    return params.map(lambda p: cap.template.with_lengths(*lengths_for(cap, p)))


def _step(cap: Capacity, op: StepOp, p: LengthParams, alloc: str, bucket: int | None) -> Step:
    q, k = lengths_for(cap, p)
    return Step(op, q, k, bucket=bucket, seed=p.seed, allocator=alloc)


def steps(
    capacity: Capacity,
    *,
    ops: Sequence[StepOp] = ("eager", "capture", "replay"),
    distributions: Sequence[str] = DISTRIBUTIONS,
    edge_cases: Iterable[str] = EDGE_CASES,
) -> st.SearchStrategy[Step]:
    """Single `Step` values: eager batches, captures of a bucket with a batch at most its size, and replays of a
    real batch through the smallest bucket that holds it (the engine's choice). Graph ops need buckets."""
    cap = capacity
    usable = [o for o in ops if o == "eager" or cap.buckets]
    if not usable:
        raise InvalidArgument(f"ops {list(ops)} need graph buckets, and the capacity has none")
    kw: dict[str, Any] = {"distributions": distributions, "edge_cases": edge_cases}
    allocs = st.sampled_from(ALLOCATORS)
    options: list[st.SearchStrategy[Step]] = []
    for op in usable:
        if op == "eager":
            options.append(st.builds(lambda p, a: _step(cap, "eager", p, a, None), length_params(cap, **kw), allocs))
        elif op == "replay":
            top = cap.buckets[-1]
            options.append(
                st.builds(
                    lambda p, a: _step(cap, "replay", p, a, cap.bucket_for(p.batch_size)),
                    length_params(cap, max_batch=top, **kw),
                    allocs,
                )
            )
        else:
            options.append(
                st.builds(lambda bp, a: _step(cap, "capture", bp[1], a, bp[0]), capture_params(cap, **kw), allocs)
            )
    return st.one_of(options)


def scenarios(
    target: Target | Capacity,
    *,
    target_name: str | None = None,
    min_steps: int = 1,
    max_steps: int = 20,
    capture_first: bool = True,
    distributions: Sequence[str] = DISTRIBUTIONS,
    edge_cases: Iterable[str] = EDGE_CASES,
) -> st.SearchStrategy[Scenario]:
    """Whole `Scenario` values: every bucket captured first (as engines do at start-up) unless `capture_first` is
    False, then `min_steps`..`max_steps` steps. Pass a `Target` (its name and config are recorded) or a `Capacity`
    with `target_name`."""
    if isinstance(target, Capacity):
        cap, config = target, {}
        name = target_name or "cpu-reference"
    else:
        from flashcheck.targets.registry import target_spec

        cap, config = target.capacity, dict(target.config())
        name = target_name or target_spec(target)
    if not 0 <= min_steps <= max_steps:
        raise InvalidArgument(f"need 0 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    kw: dict[str, Any] = {"distributions": distributions, "edge_cases": edge_cases}
    prefix: st.SearchStrategy[list[Step]] = st.just([])
    if capture_first and cap.buckets:
        prefix = st.tuples(
            *(
                st.builds(
                    lambda p, a, b=b: _step(cap, "capture", p, a, b),
                    length_params(cap, sizes=st.integers(1, b), **kw),
                    st.sampled_from(ALLOCATORS),
                )
                for b in cap.buckets
            )
        ).map(list)
    body = st.lists(steps(cap, **kw), min_size=min_steps, max_size=max_steps)
    return st.builds(
        lambda pre, rest, seed: Scenario(name, tuple(pre + rest), seed=seed, target_config=config),
        prefix,
        body,
        st.integers(0, _SEED_MAX),
    )


_MLA = (512 + 64, 512)


def templates(
    *,
    page_sizes: Sequence[int] = (1, 16, 32, 64),
    head_dims: Sequence[int] = (64, 128, 256),
    gqa_ratios: Sequence[int] = tuple(range(1, 17)),
    kv_heads: Sequence[int] = (1, 2, 4, 8),
    dtypes: Sequence[DType] = ("float16", "bfloat16"),
    kv_dtypes: Sequence[DType] | None = None,
    mla: bool = True,
    masks: bool = True,
) -> st.SearchStrategy[BatchSpec]:
    """Head configurations as templates (lengths ``(1,)``; combine with `batch_specs`).

    GQA ratios (query heads per KV head) 1..16, head dims 64/128/256, MLA (``576 = 512 + 64`` for q/k, 512 for v,
    one latent KV head) when `mla`, page sizes 1/16/32/64, query dtypes `dtypes` and KV dtypes `kv_dtypes`
    (default: same as the query); `masks` also draws causal, sliding windows and logit soft caps.
    """
    for label, vals in (
        ("page_sizes", page_sizes),
        ("head_dims", head_dims),
        ("gqa_ratios", gqa_ratios),
        ("kv_heads", kv_heads),
        ("dtypes", dtypes),
    ):
        if not vals or any((not isinstance(v, str) and int(v) < 1) for v in vals):
            raise InvalidArgument(f"templates({label}=...) needs a non-empty list of positive values, got {vals!r}")

    def build(
        page: int,
        dim: int,
        ratio: int,
        nkv: int,
        dt: DType,
        kvdt: DType | None,
        is_mla: bool,
        mask: tuple[bool, int, float],
    ) -> BatchSpec:
        causal, window, cap = mask
        if is_mla:
            return BatchSpec(
                (1,),
                (1,),
                page_size=page,
                num_qo_heads=ratio * 8,
                num_kv_heads=1,
                head_dim_qk=_MLA[0],
                head_dim_vo=_MLA[1],
                q_dtype=dt,
                kv_dtype=kvdt or dt,
                causal=causal,
            )
        return BatchSpec(
            (1,),
            (1,),
            page_size=page,
            num_qo_heads=ratio * nkv,
            num_kv_heads=nkv,
            head_dim_qk=dim,
            head_dim_vo=dim,
            q_dtype=dt,
            kv_dtype=kvdt or dt,
            causal=causal,
            window_left=window,
            logits_soft_cap=cap,
        )

    mask_st = (
        st.tuples(st.booleans(), st.sampled_from((-1, 0, 31, 127)), st.sampled_from((0.0, 30.0, 50.0)))
        if masks
        else st.just((True, -1, 0.0))
    )
    kvdt_st: st.SearchStrategy[DType | None] = st.sampled_from(kv_dtypes) if kv_dtypes else st.none()
    return st.builds(
        build,
        st.sampled_from(page_sizes),
        st.sampled_from(head_dims),
        st.sampled_from(gqa_ratios),
        st.sampled_from(kv_heads),
        st.sampled_from(dtypes),
        kvdt_st,
        st.booleans() if mla else st.just(False),
        mask_st,
    )


def _check_names(what: str, given: Iterable[str], known: Sequence[str], *, allow_empty: bool = False) -> list[str]:
    names = list(given)
    bad = [n for n in names if n not in known]
    if bad or (not names and not allow_empty):
        raise InvalidArgument(f"unknown or missing {what}(s) {bad or names}; choose from {', '.join(known)}")
    return names


def padding_policies(page_size: int) -> st.SearchStrategy[PaddingPolicy]:
    """Padding policies that fit `page_size` (SGLang's only with page size 1)."""
    opts = [PaddingPolicy.VLLM_LEGACY, PaddingPolicy.VLLM_CURRENT]
    if page_size == 1:
        opts.append(PaddingPolicy.SGLANG)
    return st.sampled_from(opts)
