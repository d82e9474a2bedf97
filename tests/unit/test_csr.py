"""FC301 csr-well-formed: every sub-check fires on a crafted bad layout and stays quiet on valid ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashcheck.batch import BatchSpec
from flashcheck.errors import InvalidArgument
from flashcheck.findings import Location
from flashcheck.layout import PaddingPolicy, PagedLayout, build_paged_layout
from flashcheck.properties.csr import CSR_WELL_FORMED, CsrInput, check_csr, check_layout

CSR_ID = CSR_WELL_FORMED.id

SPEC = BatchSpec((1, 1, 4, 1), (5, 40, 17, 16), page_size=16)


def base(padding: str = "vllm_legacy", pad_to: int = 6) -> PagedLayout:
    return build_paged_layout(SPEC, pad_to=pad_to, padding=padding, allocator="shuffled", seed=3)


def inp(layout: PagedLayout, **over: object) -> CsrInput:
    d: dict[str, object] = dict(
        kv_indptr=layout.kv_indptr.copy(),
        kv_indices=layout.kv_indices.copy(),
        kv_last_page_len=layout.kv_last_page_len.copy(),
        num_pages=layout.num_pages,
        page_size=layout.page_size,
        qo_indptr=layout.qo_indptr.copy(),
        seq_lens=layout.seq_lens.copy(),
        batch_size=layout.batch_size,
        padding=layout.padding,
    )
    d.update(over)
    return CsrInput(**d)  # type: ignore[arg-type]


def checks_of(findings: list) -> list[str]:  # type: ignore[type-arg]
    return [f.evidence["check"] for f in findings]


@pytest.mark.parametrize("policy", ["vllm_legacy", "vllm_current"])
def test_quiet_on_valid_padded_layouts(policy: str) -> None:
    assert check_layout(base(policy)) == []


def test_quiet_on_sglang_policy() -> None:
    spec = BatchSpec((1, 1, 1), (7, 1, 30), page_size=1)
    layout = build_paged_layout(spec, pad_to=8, padding="sglang", allocator="fragmented", seed=1)
    assert check_layout(layout) == []


def test_quiet_on_offset_start_kv_indptr() -> None:
    """vLLM's prefill plan passes paged_kv_indptr_cpu[prefill_start:]: not rebased, legal."""
    layout = base("vllm_legacy").with_kv_offset(37, filler=0)
    assert layout.kv_indptr[0] == 37
    assert check_layout(layout) == []


def test_fires_on_non_monotone_kv_indptr_with_index_and_values() -> None:
    layout = base()
    bad = layout.kv_indptr.copy()
    bad[2], bad[1] = 1, 4
    (f,) = check_csr(inp(layout, kv_indptr=bad), location=Location(step=7), prefix="graph bs=6 ")
    assert f.id == CSR_ID and f.evidence["check"] == "indptr-non-decreasing"
    assert f.message.startswith("graph bs=6 kv_indptr[2]=1 < kv_indptr[1]=4")
    assert f.evidence["index"] == 2 and f.location.step == 7


def test_fires_on_non_monotone_qo_indptr() -> None:
    layout = base()
    qo = layout.qo_indptr.copy()
    qo[3] = 0
    assert "indptr-non-decreasing" in checks_of(check_csr(inp(layout, qo_indptr=qo)))


def test_fires_on_qo_indptr_not_starting_at_zero() -> None:
    layout = base()
    assert checks_of(check_csr(inp(layout, qo_indptr=layout.qo_indptr + 2))) == ["qo-indptr-start"]


def test_fires_on_negative_kv_start() -> None:
    layout = base()
    bad = layout.kv_indptr.copy()
    bad[0] = -1
    assert "kv-indptr-start" in checks_of(check_csr(inp(layout, kv_indptr=bad)))


def test_fires_when_indptr_points_past_indices() -> None:
    layout = base()
    (f,) = check_csr(inp(layout, kv_indices=layout.kv_indices[:-3]))
    assert (
        f.evidence["check"] == "indptr-within-indices" and f"len(kv_indices)={len(layout.kv_indices) - 3}" in f.message
    )


def test_capacity_override_for_persistent_indices_buffer() -> None:
    layout = base()
    assert check_csr(inp(layout, kv_indices_len=len(layout.kv_indices))) == []
    assert checks_of(check_csr(inp(layout, kv_indices_len=2))) == ["indptr-within-indices"]


@pytest.mark.parametrize("value", [-1, 10_000])
def test_fires_on_page_id_out_of_range(value: int) -> None:
    layout = base()
    idx = layout.kv_indices.copy()
    idx[1] = value
    (f,) = check_csr(inp(layout, kv_indices=idx))
    assert f.evidence["check"] == "indices-in-range" and f"kv_indices[1]={value}" in f.message


def test_indices_beyond_the_used_range_are_not_checked() -> None:
    layout = base()
    idx = np.concatenate([layout.kv_indices, [-5, 99999]])  # stale tail of a persistent buffer
    assert check_csr(inp(layout, kv_indices=idx)) == []


@pytest.mark.parametrize("value", [0, 17])
def test_fires_on_last_page_len_out_of_range(value: int) -> None:
    layout = base()
    last = layout.kv_last_page_len.copy()
    last[2] = value
    found = check_csr(inp(layout, kv_last_page_len=last, seq_lens=None))
    assert checks_of(found) == ["last-page-len-range"] and f"kv_last_page_len[2]={value}" in found[0].message


def test_fires_when_qo_and_kv_cover_different_batches() -> None:
    layout = base()
    found = check_csr(inp(layout, qo_indptr=layout.qo_indptr[:-1], kv_last_page_len=layout.kv_last_page_len[:-1]))
    assert checks_of(found).count("same-batch") == 2


def test_fires_on_inconsistent_seq_lens() -> None:
    layout = base()
    seq = layout.seq_lens.copy()
    seq[1] += 1
    assert checks_of(check_csr(inp(layout, seq_lens=seq))) == ["seq-lens-consistent"]


@pytest.mark.parametrize(
    ("policy", "mutate", "field"),
    [
        ("vllm_legacy", lambda d: d["kv_last_page_len"].__setitem__(5, 0), "last_page_len"),
        ("vllm_current", lambda d: d["kv_last_page_len"].__setitem__(5, 1), "last_page_len"),
        ("vllm_legacy", lambda d: d["kv_indptr"].__setitem__(6, d["kv_indptr"][6] + 1), "pages"),
        ("vllm_current", lambda d: d["qo_indptr"].__setitem__(6, d["qo_indptr"][6] + 1), "qo_len"),
    ],
)
def test_fires_on_padding_rows_that_break_the_policy(policy: str, mutate, field: str) -> None:  # type: ignore[no-untyped-def]
    layout = base(policy)
    d = {k: v.copy() for k, v in layout.arrays().items()}
    mutate(d)
    found = check_csr(
        inp(
            layout,
            **{k: d[k] for k in ("kv_indptr", "kv_last_page_len", "qo_indptr")},
            kv_indices_len=len(layout.kv_indices) + 5,
        )
    )
    assert checks_of(found) == ["padding-policy"], found
    assert found[0].evidence["policy"] == policy and f"{field}=" in found[0].message


def test_fires_on_padding_without_declared_policy() -> None:
    layout = base()
    assert checks_of(check_csr(inp(layout, padding=PaddingPolicy.NONE))) == ["padding-policy"]


def test_sglang_padding_rows_checked() -> None:
    spec = BatchSpec((1, 1), (7, 3), page_size=1)
    layout = build_paged_layout(spec, pad_to=4, padding="sglang")
    legacy_like = inp(layout, padding=PaddingPolicy.VLLM_LEGACY)
    assert checks_of(check_csr(legacy_like)) == ["padding-policy"]


def test_works_on_torch_tensors() -> None:
    torch = pytest.importorskip("torch")
    layout = base()
    bad = torch.tensor(layout.kv_indptr)
    bad[3] = 0
    assert "indptr-non-decreasing" in checks_of(check_csr(inp(layout, kv_indptr=bad)))


def test_rejects_nonsense_parameters() -> None:
    with pytest.raises(InvalidArgument, match="page_size and num_pages must be >= 1"):
        check_csr(inp(base(), page_size=0))


@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(0, 300)), min_size=1, max_size=12),
    st.sampled_from([1, 16, 32, 64]),
    st.sampled_from(["contiguous", "shuffled", "fragmented"]),
    st.integers(0, 5),
    st.sampled_from(["vllm_legacy", "vllm_current", "sglang"]),
    st.integers(0, 2**31),
    st.integers(0, 50),
)
def test_builder_output_always_passes(reqs, page, alloc, extra, policy, seed, offset) -> None:  # type: ignore[no-untyped-def]
    if policy == "sglang":
        page = 1
    spec = BatchSpec(tuple(q for q, _ in reqs), tuple(q + e for q, e in reqs), page_size=page)
    layout = build_paged_layout(spec, pad_to=spec.batch_size + extra, padding=policy, allocator=alloc, seed=seed)
    assert check_layout(layout) == []
    assert check_layout(layout.with_kv_offset(offset)) == []
    # real rows reproduce the spec exactly
    pages = np.diff(layout.kv_indptr)[: spec.batch_size]
    assert tuple(pages) == spec.pages_per_request()
    assert tuple(layout.seq_lens[: spec.batch_size]) == spec.kv_lens
    assert len(set(layout.kv_indices[: sum(spec.pages_per_request())].tolist())) == sum(spec.pages_per_request())


# ---- boundaries (each pins a mutant of the property that the tests above let through; see reports/mutation.md) --
def _tiny(**over: object) -> CsrInput:
    """One request of 3 tokens in one page of a 1-page, 4-slot cache: the smallest well-formed batch."""
    kw: dict[str, object] = {
        "kv_indptr": np.array([0, 1], np.int32),
        "kv_indices": np.array([0], np.int32),
        "kv_last_page_len": np.array([3], np.int32),
        "num_pages": 1,
        "page_size": 4,
    }
    kw.update(over)
    return CsrInput(**kw)  # type: ignore[arg-type]


def test_the_smallest_cache_and_batch_are_well_formed() -> None:
    assert check_csr(_tiny()) == []  # num_pages == 1 is valid
    assert check_csr(_tiny(page_size=1, kv_last_page_len=np.array([1], np.int32))) == []  # page_size == 1 too
    empty = _tiny(kv_indptr=np.array([0], np.int32), kv_indices=np.array([], np.int32),
                  kv_last_page_len=np.array([], np.int32))  # fmt: skip
    assert check_csr(empty) == []  # a batch of zero requests
    with pytest.raises(InvalidArgument, match="num_pages must be >= 1"):
        check_csr(_tiny(num_pages=0))
    with pytest.raises(InvalidArgument, match="page_size and num_pages"):
        check_csr(_tiny(page_size=0))


def test_page_ids_are_in_range_up_to_num_pages_minus_one() -> None:
    two = _tiny(num_pages=2, kv_indices=np.array([1], np.int32))
    assert check_csr(two) == []
    (f,) = check_csr(_tiny(num_pages=2, kv_indices=np.array([2], np.int32)))
    assert f.evidence["check"] == "indices-in-range" and f.evidence["index"] == 0 and f.evidence["value"] == 2
    assert "kv_indices[0]=2 is outside [0, 2) (1 bad entries)" in f.message
    (neg,) = check_csr(_tiny(kv_indices=np.array([-1], np.int32)))
    assert neg.evidence["check"] == "indices-in-range" and neg.evidence["value"] == -1


def test_indptr_may_end_exactly_at_the_indices_length() -> None:
    assert check_csr(_tiny(kv_indices_len=1)) == []
    (f,) = check_csr(_tiny(kv_indptr=np.array([0, 2], np.int32), kv_indices=np.array([0, 0], np.int32),
                           kv_indices_len=1))  # fmt: skip
    assert f.evidence == {"check": "indptr-within-indices", "index": 1, "value": 2, "indices_len": 1}
    assert f.message == "kv_indptr[1]=2 > len(kv_indices)=1"


def test_every_finding_is_fc301_with_its_location_prefix_and_hint() -> None:
    where = Location(target="t", step=3, region="replay")
    found = check_csr(_tiny(kv_indptr=np.array([1, 0], np.int32)), location=where, prefix="graph bs=1 ")
    assert found
    for f in found:
        assert (f.id, f.name, f.kind) == (CSR_ID, "csr-well-formed", "property")
        assert f.location == where and f.message.startswith("graph bs=1 ") and f.hint
    plain = check_csr(_tiny(kv_last_page_len=np.array([5], np.int32)))
    assert plain and not plain[0].message.startswith(" ") and plain[0].location == Location()


def test_a_decrease_of_one_is_not_monotone() -> None:
    layout = _tiny(kv_indptr=np.array([0, 1, 0], np.int32), kv_indices=np.array([0], np.int32),
                   kv_last_page_len=np.array([3, 1], np.int32))  # fmt: skip
    (f,) = [f for f in check_csr(layout) if f.evidence["check"] == "indptr-non-decreasing"]
    assert f.message == "kv_indptr[2]=0 < kv_indptr[1]=1 (1 decreasing step(s))"
    assert f.evidence == {"check": "indptr-non-decreasing", "array": "kv_indptr", "index": 2, "value": 0,
                          "previous": 1, "count": 1}  # fmt: skip
    assert f.hint.startswith("kv_indptr must be non-decreasing")


def test_qo_indptr_start_order_and_batch_are_checked_with_their_evidence() -> None:
    base_kw: dict[str, object] = {"qo_indptr": np.array([1, 0], np.int32)}
    found = {f.evidence["check"]: f for f in check_csr(_tiny(**base_kw))}
    start = found["qo-indptr-start"]
    assert start.evidence == {"check": "qo-indptr-start", "index": 0, "value": 1}
    assert start.message == "qo_indptr[0]=1, expected 0"
    order = found["indptr-non-decreasing"]
    assert order.evidence["array"] == "qo_indptr" and order.message.startswith("qo_indptr[1]=0 < qo_indptr[0]=1")
    (batch,) = check_csr(_tiny(qo_indptr=np.array([0, 1, 2], np.int32)))
    assert batch.evidence == {"check": "same-batch", "qo_rows": 2, "kv_rows": 1}
    assert batch.message == "qo_indptr covers 2 requests but kv_indptr covers 1"
    (lasts,) = check_csr(_tiny(kv_last_page_len=np.array([3, 3], np.int32)))
    assert lasts.evidence == {"check": "same-batch", "last_page_len_len": 2, "kv_rows": 1}
    assert check_csr(_tiny(qo_indptr=np.array([0, 1], np.int32))) == []


def test_shape_and_start_of_kv_indptr() -> None:
    (empty,) = check_csr(_tiny(kv_indptr=np.array([], np.int32)))
    assert empty.evidence == {"check": "shape"} and empty.message == "kv_indptr is empty"
    over = [f for f in check_csr(_tiny(batch_size=2)) if f.evidence["check"] == "shape"]
    assert len(over) == 1 and over[0].message == "batch size 2 exceeds the 1 rows of kv_indptr"
    assert check_csr(_tiny(batch_size=1)) == []
    neg = [
        f for f in check_csr(_tiny(kv_indptr=np.array([-1, 1], np.int32))) if f.evidence["check"] == "kv-indptr-start"
    ]
    assert len(neg) == 1 and neg[0].evidence == {"check": "kv-indptr-start", "index": 0, "value": -1}
    assert neg[0].message == "kv_indptr[0]=-1 is negative"


def test_a_bad_page_id_is_located_after_the_indptr_start() -> None:
    (f,) = check_csr(_tiny(kv_indptr=np.array([1, 3], np.int32), kv_indices=np.array([9, 0, 5], np.int32),
                           kv_last_page_len=np.array([2], np.int32), num_pages=2))  # fmt: skip
    assert f.evidence == {"check": "indices-in-range", "index": 2, "value": 5, "num_pages": 2, "count": 1}
    assert f.message.startswith("kv_indices[2]=5 is outside [0, 2)")


def test_every_sub_check_says_what_to_do() -> None:
    broken = [
        _tiny(kv_indptr=np.array([], np.int32)),
        _tiny(batch_size=2),
        _tiny(kv_last_page_len=np.array([3, 3], np.int32)),
        _tiny(qo_indptr=np.array([1, 0, 2], np.int32)),
        _tiny(kv_indptr=np.array([-1, 1], np.int32)),
        _tiny(kv_indptr=np.array([0, 2], np.int32), kv_indices_len=1),
        _tiny(kv_indices=np.array([7], np.int32)),
        _tiny(kv_last_page_len=np.array([9], np.int32)),
    ]
    seen: set[str] = set()
    for case in broken:
        for f in check_csr(case):
            assert isinstance(f.hint, str) and len(f.hint) > 20, (f.evidence, f.hint)
            seen.add(str(f.evidence["check"]))
    assert {"shape", "same-batch", "qo-indptr-start", "kv-indptr-start", "indptr-within-indices",
            "indices-in-range"} <= seen, seen  # fmt: skip


def test_check_layout_passes_every_field_location_and_prefix() -> None:
    """check_layout is check_csr over the layout's own arrays: the same findings for a layout broken in its qo
    metadata, its padding rows or its real batch size, with the caller's location and prefix."""
    where = Location(target="t", step=2, region="replay")
    layout = base()
    assert layout.batch_size < len(layout.kv_indptr) - 1  # padded: the padding policy is checked on the tail
    layout.qo_indptr[0] = 1  # a qo error only the qo array shows
    layout.kv_indptr[-1] = layout.kv_indptr[-2] + 1  # a padding row that is not empty under vllm_legacy
    direct = check_csr(inp(layout), location=where, prefix="graph bs=6 ")
    via = check_layout(layout, location=where, prefix="graph bs=6 ")
    assert [(f.evidence, f.message) for f in via] == [(f.evidence, f.message) for f in direct]
    checks = {f.evidence["check"] for f in via}
    assert "qo-indptr-start" in checks and len(checks) >= 2, checks
    assert all(f.location == where and f.message.startswith("graph bs=6 ") for f in via)


def test_padding_findings_carry_the_row_and_what_the_policy_wants() -> None:
    undeclared = [
        f for f in check_csr(inp(base(), padding=PaddingPolicy.NONE)) if f.evidence["check"] == "padding-policy"
    ]
    (f,) = undeclared
    n_rows = len(base().kv_indptr) - 1
    assert f.evidence == {"check": "padding-policy", "real_rows": SPEC.batch_size, "rows": n_rows}
    assert f.message == f"{n_rows - SPEC.batch_size} padded row(s) but no padding policy was declared" and f.hint
    layout = base()
    row = SPEC.batch_size  # the first padded row gets a page it must not have under vllm_legacy
    layout.kv_indptr[row + 1 :] += 1
    (bad,) = [f for f in check_csr(inp(layout)) if f.evidence["check"] == "padding-policy"]
    ev = bad.evidence
    assert ev["index"] == row and ev["policy"] == "vllm_legacy" and ev["got"]["pages"] == 1
    assert ev["want"] == {"pages": 0, "last_page_len": ev["want"]["last_page_len"], "qo_len": ev["want"]["qo_len"]}
    assert bad.message.startswith(f"padded row {row} has pages=1, policy vllm_legacy requires 0")
    assert "fill padded rows as vllm_legacy does" in bad.hint
    # without qo_indptr only pages and last_page_len are compared
    (no_qo,) = [f for f in check_csr(inp(layout, qo_indptr=None)) if f.evidence["check"] == "padding-policy"]
    assert set(no_qo.evidence["want"]) == {"pages", "last_page_len"}


def small(last: list[int], seq: list[int]) -> list:  # type: ignore[type-arg]
    """Three requests of 1, 0 and 2 pages of 16: the middle one is empty."""
    return check_csr(
        CsrInput(
            kv_indptr=np.array([0, 1, 1, 3]),
            kv_indices=np.array([4, 2, 7]),
            kv_last_page_len=np.array(last),
            num_pages=8,
            page_size=16,
            seq_lens=np.array(seq),
        )
    )


def test_an_empty_request_may_have_last_page_len_zero_and_seq_len_zero() -> None:
    assert small([5, 0, 16], [5, 0, 32]) == []


def test_last_page_len_out_of_range_names_the_request_the_value_and_the_page_size() -> None:
    (f,) = small([5, 0, 17], [5, 0, 33])
    assert f.evidence == {"check": "last-page-len-range", "index": 2, "value": 17, "page_size": 16}
    assert f.message.endswith("kv_last_page_len[2]=17 is outside [1, 16] for a request with 2 page(s)")


def test_seq_lens_of_exactly_the_batch_are_checked_against_pages_and_last_page_len() -> None:
    (f,) = small([5, 0, 16], [5, 0, 31])
    assert f.evidence == {"check": "seq-lens-consistent", "index": 2, "value": 31, "expected": 32}
    assert f.hint == "derive seq_lens, pages and last_page_len from one source each step"
    (g,) = small([5, 0, 16], [5, 1, 32])
    assert g.evidence["index"] == 1 and g.evidence["expected"] == 0


def test_a_padding_policy_given_by_name_is_parsed() -> None:
    layout = base()
    got = inp(layout, padding="vllm_legacy")
    assert got.padding is PaddingPolicy.VLLM_LEGACY and check_csr(got) == []


def test_check_layout_reads_the_layouts_seq_lens_and_adds_no_prefix_of_its_own() -> None:
    layout = base()
    layout.seq_lens[1] += 1
    (f,) = check_layout(layout)
    assert f.evidence["check"] == "seq-lens-consistent" and f.message.startswith("seq_lens[1]=")
