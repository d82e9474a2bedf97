"""FlashInfer's workspace planners, restated in pure Python: the allocations one ``plan()`` makes for one batch.

Each function mirrors the sizing half of a C++ planner in ``include/flashinfer/attention/scheduler.cuh`` (the
split-KV decision, the padded batch size, the CTA tile, then every ``AlignedAllocator`` allocation in order) for
the two rule sets flashcheck supports, ``"0.6"`` (FlashInfer 0.6.13) and ``"0.7"`` (0.7.2.post1). A batch is given
as groups of identical requests, so that a search can evaluate thousands of large batches cheaply. No torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Alloc",
    "Batch",
    "PlanSizes",
    "Rules",
    "Shape",
    "aligned_end",
    "decode_blocks_per_sm_bound",
    "decode_cuda_plan",
    "fa2_cta_tile_q",
    "fa2_plan",
    "fa3_plan",
    "holistic_plan",
    "mla_plan",
]

Rules = Literal["0.6", "0.7"]
I32 = 4  # sizeof(IdType): flashcheck's targets and the engines plan with int32 indptrs


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Shape:
    """The attention geometry a planner sees."""

    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_vo: int
    page_size: int
    kv_bytes: int = 2
    causal: bool = True

    @property
    def group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads


@dataclass(frozen=True)
class Batch:
    """One step's requests as ``(count, qo_len, kv_len)`` groups; lengths in tokens (kv includes the new ones)."""

    groups: tuple[tuple[int, int, int], ...]

    @classmethod
    def of(cls, qo_lens: Iterable[int], kv_lens: Iterable[int]) -> Batch:
        return cls(tuple((1, int(q), int(k)) for q, k in zip(qo_lens, kv_lens, strict=True)))

    @property
    def size(self) -> int:
        return sum(c for c, _, _ in self.groups)

    @property
    def total_qo(self) -> int:
        return sum(c * q for c, q, _ in self.groups)

    def lens(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        qo: list[int] = []
        kv: list[int] = []
        for c, q, k in self.groups:
            qo += [q] * c
            kv += [k] * c
        return tuple(qo), tuple(kv)

    def describe(self) -> str:
        return " + ".join(f"{c} x (qo {q}, kv {k})" for c, q, k in self.groups)


@dataclass(frozen=True)
class Alloc:
    name: str
    size: int
    align: int = 16


@dataclass(frozen=True)
class PlanSizes:
    """The allocations of one plan and the planner's decisions (``padded_batch_size``, ``split_kv``...)."""

    float_allocs: tuple[Alloc, ...]
    int_allocs: tuple[Alloc, ...]
    facts: Mapping[str, int] = field(default_factory=dict)
    float_bytes: int = field(init=False)
    int_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "float_bytes", aligned_end(self.float_allocs))
        object.__setattr__(self, "int_bytes", aligned_end(self.int_allocs))


def aligned_end(allocs: Iterable[Alloc]) -> int:
    """Bytes an ``AlignedAllocator`` needs for `allocs` in order (the base is at least 16-byte aligned): what
    ``num_allocated_bytes()`` returns, and the smallest buffer the allocations fit in."""
    off = 0
    for a in allocs:
        off = _cdiv(off, a.align) * a.align + a.size
    return off


# --------------------------------------------------------------------------------------------- FA2 (PrefillPlan)
def fa2_cta_tile_q(avg_packed_qo_len: int, shape: Shape, rules: Rules) -> int:
    """``FA2DetermineCtaTileQ`` on sm80+ (the VO dimension is the planner's ``head_dim``)."""
    d_vo, d_qk = shape.head_dim_vo, shape.head_dim_qk
    if rules == "0.7":
        if d_vo >= 512:
            return 16 if avg_packed_qo_len <= 32 else 32
        if d_qk >= 512:
            return 16
    if avg_packed_qo_len > 64 and d_vo < 256:
        return 128
    return 64 if avg_packed_qo_len > 16 else 16


def _fa2_chunk(packed: list[tuple[int, int, int]], max_kv: int, max_bs: int, cta: int, min_chunk: int) -> int:
    """``PrefillBinarySearchKVChunkSize``: the smallest KV chunk (in pages) whose split batch fits `max_bs`."""
    low, high = min_chunk, max_kv
    while low < high:
        mid = (low + high) // 2
        n = sum(c * _cdiv(p, cta) * _cdiv(max(k, 1), mid) for c, p, k in packed)
        if n > max_bs:
            low = mid + 1
        else:
            high = mid
    return low


def fa2_plan(
    shape: Shape,
    batch: Batch,
    *,
    rules: Rules,
    num_sm: int,
    graph: bool = False,
    total_rows: int | None = None,
    uniform_q_len: int = 0,
    window_left: int = -1,
) -> PlanSizes:
    """``PrefillPlan`` (paged and ragged prefill on fa2, tensor-core decode). `batch` kv lengths are in tokens;
    the planner sees pages (``kv_indptr``), tokens for ragged (page size 1). `total_rows` is the graph's sticky
    row count (default: the batch's rows)."""
    g = shape.group
    bsz = batch.size
    rows = batch.total_qo if total_rows is None else total_rows
    max_bs_if_split = (2 * num_sm) // shape.num_kv_heads
    min_chunk = max(128 // shape.page_size, 1)
    packed = [(c, q * g, _cdiv(k, shape.page_size)) for c, q, k in batch.groups]
    if graph and rules == "0.7" and uniform_q_len > 0:
        cta = fa2_cta_tile_q(uniform_q_len * g, shape, rules)
        tiles_total = bsz * _cdiv(uniform_q_len * g, cta)
    elif graph:
        cta = fa2_cta_tile_q((rows - bsz + 1) * g, shape, rules)
        tiles_total = _cdiv(rows * g, cta) + bsz - 1
    else:
        cta = fa2_cta_tile_q(sum(c * p for c, p, _ in packed) // max(bsz, 1), shape, rules)
        tiles_total = sum(c * _cdiv(p, cta) for c, p, _ in packed)
    if window_left >= 0:
        eff = [(c, p, min(_cdiv(window_left + cta, shape.page_size), k)) for c, p, k in packed]
    else:
        eff = packed
    max_kv = max([1] + [k for _, _, k in eff])
    chunk = _fa2_chunk(eff, max_kv, max_bs_if_split, cta, min_chunk)
    split = graph or chunk < max_kv
    new_bs = sum(c * _cdiv(p, cta) * _cdiv(max(k, 1), chunk) for c, p, k in eff)
    padded = max(max_bs_if_split, tiles_total) if graph else new_bs
    ints = [
        Alloc("batch_prefill_request_indices", I32 * padded),
        Alloc("batch_prefill_qo_tile_indices", I32 * padded),
        Alloc("batch_prefill_kv_tile_indices", I32 * padded),
        Alloc("batch_prefill_o_indptr", I32 * (bsz + 1)),
        Alloc("batch_prefill_kv_chunk_size_ptr", I32, 1),
    ]
    if graph:
        ints.append(Alloc("batch_prefill_total_num_rows", 4))
    floats = list(fa2_float_allocs(shape, padded, cta, rules)) if split else []
    if split:
        ints.append(Alloc("batch_prefill_merge_indptr", I32 * (rows + 1)))
    if (split and rules == "0.6") or (graph and rules == "0.7"):
        ints.append(Alloc("batch_prefill_block_valid_mask", padded))
    facts = {"padded_batch_size": padded, "new_batch_size": new_bs, "split_kv": int(split), "cta_tile_q": cta}
    return PlanSizes(tuple(floats), tuple(ints), facts)


def fa2_float_allocs(shape: Shape, padded: int, cta: int, rules: Rules) -> tuple[Alloc, Alloc]:
    """``batch_prefill_tmp_v`` and ``tmp_s``: one fp32 partial output and LSE per (head, padded CTA, tile row);
    0.7 counts tile rows as query rows (``ceil(padded * cta / group)``), 0.6 as packed rows."""
    rows = padded * cta if rules == "0.6" else _cdiv(padded * cta, shape.group)
    h = shape.num_qo_heads
    return (
        Alloc("batch_prefill_tmp_v", h * rows * shape.head_dim_vo * 4),
        Alloc("batch_prefill_tmp_s", h * rows * 4),
    )


# ------------------------------------------------------------------------------------- CUDA-core decode (DecodePlan)
def decode_blocks_per_sm_bound(shape: Shape, *, max_blocks: int = 32, max_threads: int = 2048) -> int:
    """An upper bound on the occupancy of ``BatchDecodeWithPagedKVCacheKernel`` on sm90 (threads, shared memory
    and the block limit; registers can only lower it). The planner's grid is this times the SM count."""
    d, g = shape.head_dim_qk, shape.group
    vec = max(16 // shape.kv_bytes, d // 32)
    bdx = d // vec
    threads = max(128, bdx * g)
    bdz = threads // (bdx * g)
    tile = (2 if shape.kv_bytes == 1 else 4) if g == 1 else 1
    smem = 2 * 2 * tile * g * bdz * d * shape.kv_bytes + max(tile * threads * 8, 2 * g * bdz * 4)
    by_smem = (228 * 1024) // (smem + 1024)
    return max(1, min(max_blocks, max_threads // threads, by_smem))


def decode_cuda_plan(shape: Shape, batch: Batch, *, max_grid_size: int, graph: bool = False) -> PlanSizes:
    """``DecodePlan`` with ``BatchDecodeWithPagedKVCacheWorkEstimationDispatched`` (same rules in 0.6 and 0.7)."""
    bsz = batch.size
    gdy = shape.num_kv_heads
    pages = [(c, _cdiv(k, shape.page_size)) for c, _, k in batch.groups]
    if bsz * gdy >= max_grid_size:
        split, new_bs = False, bsz
    else:
        low, high = max(128 // shape.page_size, 1), max([0] + [p for _, p in pages])
        while low < high:
            mid = (low + high) // 2
            if sum(c * _cdiv(p, mid) for c, p in pages) * gdy > max_grid_size:
                low = mid + 1
            else:
                high = mid
        new_bs = sum(c * _cdiv(max(p, 1), low) for c, p in pages)
        split = not (new_bs == bsz and not graph)
    padded = (max_grid_size // gdy if split else bsz) if graph else new_bs
    ints = [
        Alloc("batch_decode_request_indices", I32 * padded),
        Alloc("batch_decode_kv_tile_indices", I32 * padded),
        Alloc("batch_decode_o_indptr", I32 * (padded + 1)),
        Alloc("batch_decode_kv_chunk_size_ptr", I32, 1),
    ]
    floats: list[Alloc] = []
    if split:
        h, d = shape.num_qo_heads, shape.head_dim_vo
        floats = [Alloc("batch_decode_tmp_v", h * padded * d * 4), Alloc("batch_decode_tmp_s", h * padded * 4)]
        ints.append(Alloc("batch_decode_block_valid_mask", padded))
    facts = {"padded_batch_size": padded, "new_batch_size": new_bs, "split_kv": int(split)}
    return PlanSizes(tuple(floats), tuple(ints), facts)


# ------------------------------------------------------------------------------------------ FA3 (PrefillSM90Plan)
def fa3_plan(
    shape: Shape, batch: Batch, *, num_sm: int, graph: bool = False, total_rows: int | None = None
) -> PlanSizes:
    """``PrefillSM90Plan``: int workspace only (the fa3 kernels do not split KV)."""
    bsz = batch.size
    rows = batch.total_qo if total_rows is None else total_rows
    cta = 192 if shape.head_dim_vo == 64 else 128
    per_head = _cdiv(rows, cta) + bsz - 1
    same = per_head > 4096
    heads = 1 if same else shape.num_qo_heads
    works = per_head * heads if graph else heads * sum(c * _cdiv(q, cta) for c, q, _ in batch.groups)
    names = ("qo_tile_indices", "qo_offset", "kv_offset", "qo_len", "kv_len", "head_indices")
    ints = [Alloc(f"batch_prefill_sm90_{n}", I32 * works) for n in names]
    ints.append(Alloc("batch_prefill_sm90_work_indptr", I32 * (num_sm + 1)))
    ints.append(Alloc("batch_prefill_sm90_batch_indices", I32 * works))
    facts = {"total_num_works": works, "same_schedule_for_all_heads": int(same), "cta_tile_q": cta}
    return PlanSizes((), tuple(ints), facts)


# ------------------------------------------------------------------------------------------------- MLA (MLAPlan)
MLA_MAX_WORKS = 16384


def mla_plan(shape: Shape, batch: Batch, *, num_sm: int) -> PlanSizes:
    """``MLAPlan`` (fa2 and fa3 backends): fixed-size arrays; only the cluster size depends on the batch."""
    bsz = max(batch.size, 1)
    avg_packed = sum(c * q * shape.num_qo_heads for c, q, _ in batch.groups) // bsz
    cluster = 2 if avg_packed > 64 else 1
    clusters = num_sm // cluster
    tile = cluster * 64
    works = ("q_indptr", "kv_indptr", "partial_indptr")
    merges: tuple[str, ...] = ("packed_offset_start", "packed_offset_end", "partial_packed_offset_start")
    merges += ("partial_packed_offset_end", "partial_stride")
    tail = ("q_len", "kv_len", "q_start", "kv_start", "kv_end", "work_indptr")
    ints = [Alloc(f"mla_{n}", I32 * MLA_MAX_WORKS) for n in works]
    ints += [Alloc(f"mla_merge_{n}", I32 * num_sm) for n in merges]
    ints += [Alloc(f"mla_{n}", I32 * MLA_MAX_WORKS) for n in tail]
    floats = (
        Alloc("mla_partial_o", 2 * clusters * tile * 2 * shape.head_dim_vo),
        Alloc("mla_partial_lse", 2 * clusters * tile * 4),
    )
    return PlanSizes(floats, tuple(ints), {"cluster_size": cluster, "num_clusters": clusters})


# ------------------------------------------------------------------------------- BatchAttention (TwoStageHolistic)
HOLISTIC_MAX_WORKS = 65536


def holistic_plan(shape: Shape, batch: Batch, *, num_sm: int) -> PlanSizes:
    """``TwoStageHolisticPlan`` (``BatchAttention``): fixed-size arrays, independent of the batch."""
    del batch
    clusters = num_sm * (1 if shape.head_dim_vo >= 256 else 2)
    max_splits = 4 * clusters * (128 + 16)
    names: tuple[str, ...] = ("q_indptr", "kv_indptr", "partial_indptr", "q_len", "kv_len", "q_start", "kv_start")
    names += ("kv_end",)
    names += ("kv_head_idx", "work_indptr")
    ints = [Alloc(f"task{t}_{n}", I32 * HOLISTIC_MAX_WORKS) for t in (0, 1) for n in names]
    ints += [
        Alloc("len_kv_chunk", I32 * 2),
        Alloc("merge_indptr", I32 * max_splits),
        Alloc("merge_o_indices", I32 * max_splits),
        Alloc("num_qo_len_offset", I32),
    ]
    hkv = shape.num_kv_heads
    floats = (
        Alloc("holistic_partial_o", max_splits * 2 * shape.head_dim_vo * hkv),
        Alloc("holistic_partial_lse", max_splits * 4 * hkv),
    )
    return PlanSizes(floats, tuple(ints), {"max_num_kv_splits": max_splits})
