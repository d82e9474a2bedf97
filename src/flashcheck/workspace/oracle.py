"""The workspace oracle: per wrapper use and workspace kind, an analytic upper bound over every batch the
configuration admits, the adversarially searched maximum with its witness batch, and a recommended size.

Bases: ``exact`` (the planner's allocation does not depend on the batch: graph buckets, MLA, BatchAttention),
``proven`` (a closed form from the allocation formulas that no valid batch can exceed, tight when the search
reaches it) and, where flashcheck models an occupancy limit, ``proven`` against that limit (the CUDA-core decode
grid; set ``decode_blocks_per_sm`` to the measured value). Pure Python.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from flashcheck.workspace.config import EngineConfig, MiB, WrapperUse
from flashcheck.workspace.planner import (
    Alloc,
    Batch,
    PlanSizes,
    Rules,
    aligned_end,
    decode_blocks_per_sm_bound,
    decode_cuda_plan,
    fa2_cta_tile_q,
    fa2_float_allocs,
    fa2_plan,
    fa3_plan,
    holistic_plan,
    mla_plan,
)

__all__ = ["KINDS", "KindBound", "OracleResult", "UseSpec", "plan_for", "run_oracle", "uses_of"]

Kind = Literal["float", "int", "pinned"]
KINDS: tuple[Kind, ...] = ("float", "int", "pinned")
Basis = Literal["exact", "proven"]


@dataclass(frozen=True)
class UseSpec:
    """One planned wrapper: eager (``bucket`` None) or the graph wrapper of one bucket, under one rule set."""

    use: WrapperUse
    rules: Rules
    bucket: int | None = None

    @property
    def label(self) -> str:
        mode = "eager" if self.bucket is None else f"graph bs={self.bucket}"
        return f"{self.use.label} {mode}"


@dataclass
class KindBound:
    """The answer for one workspace kind of one wrapper use."""

    use: str
    rules: Rules
    kind: Kind
    bound: int
    basis: Basis
    searched: int
    witness: Batch | None
    formula: str
    facts: dict[str, int] = field(default_factory=dict)

    @property
    def tight(self) -> bool:
        return self.searched == self.bound

    def to_dict(self) -> dict[str, Any]:
        qo, kv = self.witness.lens() if self.witness is not None else ((), ())
        return {
            "use": self.use,
            "flashinfer_rules": self.rules,
            "kind": self.kind,
            "bound_bytes": self.bound,
            "basis": self.basis,
            "searched_bytes": self.searched,
            "tight": self.tight,
            "witness": None if self.witness is None else {"qo_lens": list(qo), "kv_lens": list(kv)},
            "witness_summary": None if self.witness is None else self.witness.describe(),
            "formula": self.formula,
            "planner_facts": self.facts,
        }


@dataclass
class OracleResult:
    config: EngineConfig
    bounds: list[KindBound]

    def required(self, kind: Kind) -> int:
        """The bytes a workspace of `kind` shared by every use needs (the largest bound)."""
        return max([b.bound for b in self.bounds if b.kind == kind] or [0])

    def worst(self, kind: Kind) -> KindBound | None:
        cands = [b for b in self.bounds if b.kind == kind]
        return max(cands, key=lambda b: (b.bound, b.searched)) if cands else None

    def recommended(self, kind: Kind) -> int:
        need = self.required(kind)
        return _round_mib(int(need * (1 + self.config.margin))) if need else 0


def _round_mib(n: int) -> int:
    return -(-n // MiB) * MiB


def uses_of(cfg: EngineConfig) -> list[UseSpec]:
    """Every (wrapper, mode, rules) the configuration plans: the eager wrapper, and one per graph bucket."""
    out: list[UseSpec] = []
    for rules in cfg.rules:
        for use in cfg.wrappers:
            out.append(UseSpec(use, rules))
            if use.graph:
                out.extend(UseSpec(use, rules, b) for b in cfg.graph_buckets)
    return out


def decode_grid(cfg: EngineConfig) -> int:
    bps = cfg.decode_blocks_per_sm or decode_blocks_per_sm_bound(cfg.shape)
    return bps * cfg.num_sms


def plan_for(cfg: EngineConfig, spec: UseSpec, batch: Batch) -> PlanSizes:
    """The allocations of `spec`'s planner for `batch` (a graph use plans the bucket's sticky row count)."""
    w, shape, graph = spec.use, cfg.shape, spec.bucket is not None
    rows = spec.bucket * cfg.spec_len if spec.bucket is not None else None
    if w.wrapper == "mla":
        return mla_plan(shape, batch, num_sm=cfg.num_sms)
    if w.wrapper == "batch_attention":
        return holistic_plan(shape, batch, num_sm=cfg.num_sms)
    if w.wrapper == "decode" and w.backend == "cuda":
        return decode_cuda_plan(shape, batch, max_grid_size=decode_grid(cfg), graph=graph)
    if w.backend == "fa3":
        return fa3_plan(shape, batch, num_sm=cfg.num_sms, graph=graph, total_rows=rows)
    uniform = cfg.spec_len if (w.wrapper == "decode" and cfg.spec_len > 1) else 0
    return fa2_plan(
        shape, batch, rules=spec.rules, num_sm=cfg.num_sms, graph=graph, total_rows=rows, uniform_q_len=uniform
    )


# ------------------------------------------------------------------------------------------ the valid batches
def _qo_per_request(cfg: EngineConfig, spec: UseSpec) -> int | None:
    """Fixed query rows per request (decode and graph uses), or None when prefill lengths vary."""
    if spec.use.wrapper == "decode" or spec.bucket is not None:
        return cfg.spec_len
    return None


def _kv_values(cfg: EngineConfig, q: int) -> list[int]:
    """KV lengths (tokens) that hit the split-KV boundaries: multiples of the minimum chunk up to a few times
    the CTA budget, powers of two, and the longest sequence."""
    page = cfg.page_size
    unit = max(128 // page, 1) * page
    budget = ((2 * cfg.num_sms) // cfg.num_kv_heads + 1) * 4
    vals = {unit * k for k in range(1, budget + 1)}
    vals |= {1 << i for i in range(4, 40) if (1 << i) <= cfg.max_seq_len}
    vals |= {cfg.max_seq_len, q}
    return sorted(v for v in vals if q <= v <= cfg.max_seq_len)


def candidates(cfg: EngineConfig, spec: UseSpec, seed: int = 0, n_random: int = 200) -> Iterator[Batch]:
    """Valid batches that push the planner's sizes up: one request sweeping the split-KV chunk boundaries, many
    equal requests, many short requests beside one long one (most query tiles), and seeded random batches."""
    fixed = _qo_per_request(cfg, spec)
    if spec.bucket is not None:  # a graph plan does not depend on the lengths: a short KV keeps the replay small
        yield Batch(((spec.bucket, cfg.spec_len, max(cfg.spec_len, min(cfg.max_seq_len, 8 * cfg.page_size))),))
        return
    tokens = cfg.max_tokens
    bmax = min(cfg.max_batch, tokens // (fixed or 1))
    qcap = fixed or cfg.qo_cap
    g = cfg.num_qo_heads // cfg.num_kv_heads
    qs = {fixed} if fixed else {1, qcap, max(1, 16 // g + 1), max(1, 64 // g + 1), max(1, 128 // g), 128, 129}
    qs = {q for q in qs if q is not None and 1 <= q <= qcap}
    sizes = sorted({b for b in (1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512, 1024, bmax) if 1 <= b <= bmax})
    for q in sorted(qs):
        for kv in _kv_values(cfg, q):
            yield Batch(((1, q, kv),))
    for b in sizes:
        for q in sorted({q for q in (*qs, tokens // b) if 1 <= q <= qcap and q * b <= tokens}):
            for kv in {q, max(q, min(cfg.max_seq_len, 4096)), cfg.max_seq_len}:
                yield Batch(((b, q, kv),))
        if fixed is None and b > 1:
            long_q = min(qcap, tokens - (b - 1))
            if long_q >= 1:
                yield Batch(((b - 1, 1, 1), (1, long_q, max(long_q, cfg.max_seq_len))))
    rng = random.Random(seed)
    for _ in range(n_random):
        b = rng.randint(1, bmax)
        left = tokens
        groups = []
        for _ in range(b):
            q = fixed or rng.randint(1, max(1, min(qcap, left - 1 if left > 1 else 1)))
            if q > left:
                break
            left -= q
            groups.append((1, q, rng.randint(q, cfg.max_seq_len)))
        if groups:
            yield Batch(tuple(groups))


def search(cfg: EngineConfig, spec: UseSpec, *, seed: int = 0) -> dict[Kind, tuple[int, Batch, PlanSizes]]:
    """The largest size per kind over `candidates`, with the batch that needs it and its plan."""
    best: dict[Kind, tuple[int, Batch, PlanSizes]] = {}
    for batch in candidates(cfg, spec, seed):
        plan = plan_for(cfg, spec, batch)
        for kind, n in (("float", plan.float_bytes), ("int", plan.int_bytes)):
            k: Kind = kind  # type: ignore[assignment]
            if k not in best or n > best[k][0]:
                best[k] = (n, batch, plan)
    best["pinned"] = best["int"]
    return best


# ------------------------------------------------------------------------------------------- analytic bounds
def analytic(cfg: EngineConfig, spec: UseSpec) -> dict[Kind, tuple[int, Basis, str]]:
    """Per kind: the upper bound over all valid batches, its basis and the formula it comes from."""
    w, shape = spec.use, cfg.shape
    if spec.bucket is not None or w.wrapper in ("mla", "batch_attention"):
        return _exact(cfg, spec)
    tokens, fixed = cfg.max_tokens, _qo_per_request(cfg, spec)
    bmax = min(cfg.max_batch, tokens // (fixed or 1))
    rows = bmax * fixed if fixed else tokens
    if w.wrapper == "decode" and w.backend == "cuda":
        grid = decode_grid(cfg)
        split_pad = grid // shape.num_kv_heads
        pad = max(split_pad, bmax)
        floats = [Alloc("tmp_v", shape.num_qo_heads * split_pad * shape.head_dim_vo * 4)]
        floats.append(Alloc("tmp_s", shape.num_qo_heads * split_pad * 4))
        ints = [Alloc("ri", 4 * pad), Alloc("kt", 4 * pad), Alloc("oi", 4 * (pad + 1)), Alloc("cs", 4, 1)]
        ints.append(Alloc("mask", pad))
        f = f"split: padded <= grid/num_kv_heads = {grid}/{shape.num_kv_heads} = {split_pad} (grid {grid} = SMs x "
        f += "blocks/SM); tmp_v = H*padded*d_vo*4, tmp_s = H*padded*4"
        return {"float": (aligned_end(floats), "proven", f), "int": (aligned_end(ints), "proven", f)}
    if w.backend == "fa3":
        cta = 192 if shape.head_dim_vo == 64 else 128
        per_head = -(-rows // cta) + bmax - 1
        works = max(shape.num_qo_heads * min(per_head, 4096), per_head)
        ints = [Alloc("a", 4 * works)] * 6 + [Alloc("wi", 4 * (cfg.num_sms + 1)), Alloc("bi", 4 * works)]
        f = f"works <= H*min(ceil(rows/{cta})+B-1, 4096) or ceil(rows/{cta})+B-1 = {works}; 7 int32 arrays"
        return {"float": (0, "proven", "fa3 plans no float workspace"), "int": (aligned_end(ints), "proven", f)}
    # fa2 eager (prefill, ragged, tensor-core decode)
    max_bs = (2 * cfg.num_sms) // shape.num_kv_heads
    g = shape.group
    q_max = fixed or cfg.qo_cap
    cta = fa2_cta_tile_q(q_max * g, shape, spec.rules)  # the tile grows with the average packed query length
    floats = list(fa2_float_allocs(shape, max_bs, cta, spec.rules))
    # split: padded <= max_bs, with merge_indptr (and 0.6's mask); unsplit: padded = query tiles, neither
    tiles = _unsplit_tiles(cfg, spec.rules, rows * g, bmax, fixed)
    head = [Alloc("ri", 4 * max_bs), Alloc("qt", 4 * max_bs), Alloc("kt", 4 * max_bs), Alloc("oi", 4 * (bmax + 1))]
    # a split plan has at most max_bs query tiles of at most cta packed rows each: that caps its rows
    split_rows = min(rows, max_bs * cta // g)
    split_ints = [*head, Alloc("cs", 4, 1), Alloc("merge", 4 * (split_rows + 1))]
    if spec.rules == "0.6":
        split_ints.append(Alloc("mask", max_bs))
    unsplit = [Alloc("ri", 4 * tiles), Alloc("qt", 4 * tiles), Alloc("kt", 4 * tiles), Alloc("oi", 4 * (bmax + 1))]
    unsplit.append(Alloc("cs", 4, 1))
    int_bound = max(aligned_end(split_ints), aligned_end(unsplit))
    rows_f = "padded*cta" if spec.rules == "0.6" else "ceil(padded*cta/group)"
    f = (
        f"split only when the split batch fits 2*SMs/num_kv_heads = {max_bs} CTAs, so padded <= {max_bs}; "
        f"cta_tile_q <= {cta}; tmp_v = H*{rows_f}*d_vo*4, tmp_s = H*{rows_f}*4; int: padded <= "
        f"{max_bs} with merge_indptr[rows+1] (rows <= {split_rows}) when split, else the query tiles of an "
        f"unsplit batch (<= {tiles})"
    )
    return {"float": (aligned_end(floats), "proven", f), "int": (int_bound, "proven", f)}


def _unsplit_tiles(cfg: EngineConfig, rules: Rules, packed_max: int, bmax: int, fixed: int | None) -> int:
    """The most query tiles an unsplit eager fa2 plan can have: ``sum ceil(p_i / cta) <= (P + B (cta - 1)) / cta``
    for packed rows P, where the tile ``cta`` is chosen from the average ``floor(P / B)``: a small tile only
    comes with a small average, which caps P at ``(largest average of that tile + 1) * B - 1``."""
    shape = cfg.shape
    if fixed:  # every request has the same rows: one tile size, B requests
        cta = fa2_cta_tile_q(fixed * shape.group, shape, rules)
        return bmax * -(-fixed * shape.group // cta)
    last: dict[int, int] = {}  # tile -> the largest average (below 130) that selects it
    for avg in range(130):  # the tile function changes only at averages 16, 32 and 64
        last[fa2_cta_tile_q(avg, shape, rules)] = avg
    best = 0
    for cta, avg in last.items():
        p = packed_max if avg == 129 else min(packed_max, (avg + 1) * bmax - 1)
        best = max(best, (p + bmax * (cta - 1)) // cta)
    return best


def _exact(cfg: EngineConfig, spec: UseSpec) -> dict[Kind, tuple[int, Basis, str]]:
    if spec.bucket is not None and spec.use.wrapper not in ("mla", "batch_attention"):
        batch = next(candidates(cfg, spec))
        p = plan_for(cfg, spec, batch)
        f = (
            f"graph plan of {spec.bucket} requests x {cfg.spec_len} rows: fixed by the bucket "
            f"({', '.join(f'{k}={v}' for k, v in p.facts.items())})"
        )
        # the CUDA-core decode grid comes from an occupancy bound unless the measured blocks/SM are given
        basis: Basis = "proven" if spec.use.backend == "cuda" and not cfg.decode_blocks_per_sm else "exact"
        return {"float": (p.float_bytes, basis, f), "int": (p.int_bytes, basis, f)}
    # MLA / BatchAttention: fixed arrays; MLA's cluster size (1 or 2) is the only batch-dependent choice
    probes = [Batch(((1, 1, 1),)), Batch(((1, cfg.qo_cap, cfg.max_seq_len),))]
    plans = [plan_for(cfg, spec, b) for b in probes]
    f = (
        "fixed-size planner arrays (max over cluster sizes 1 and 2)"
        if spec.use.wrapper == "mla"
        else ("fixed-size planner arrays: 4*clusters*144 kv splits")
    )
    return {
        "float": (max(p.float_bytes for p in plans), "exact", f),
        "int": (max(p.int_bytes for p in plans), "exact", f),
    }


def run_oracle(cfg: EngineConfig, *, seed: int = 0, progress: Callable[[str], None] | None = None) -> OracleResult:
    """Bounds, searched maxima and witnesses for every wrapper use of `cfg` and every workspace kind."""
    out: list[KindBound] = []
    for spec in uses_of(cfg):
        if progress is not None:
            progress(spec.label)
        bounds = analytic(cfg, spec)
        found = search(cfg, spec, seed=seed)
        for kind in KINDS:
            bound, basis, formula = bounds["int" if kind == "pinned" else kind]
            n, batch, plan = found[kind]
            if n > bound:  # a bound the search beats is a bug in the bound: never report less than was found
                raise AssertionError(f"{spec.label} {kind}: searched {n} > bound {bound} ({formula})")
            out.append(KindBound(spec.label, spec.rules, kind, bound, basis, n, batch, formula, dict(plan.facts)))
    return OracleResult(cfg, out)
