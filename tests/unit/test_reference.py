"""The CPU reference attention agrees with a naive dense implementation (float64 loops) on generated shapes."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from flashcheck.batch import BatchSpec
from flashcheck.layout import build_paged_layout, build_ragged_layout
from flashcheck.reference import mla_reference, paged_attention, ragged_attention


def naive(q, k, v, causal, scale, window, cap):  # type: ignore[no-untyped-def]
    """One request, float64, query by query, head by head."""
    length, heads, _ = q.shape
    s_len, kv_heads, _ = k.shape
    g = heads // kv_heads
    out = np.zeros((length, heads, v.shape[-1]))
    for r in range(length):
        pos = s_len - length + r
        for h in range(heads):
            scores = []
            for j in range(s_len):
                if (causal and j > pos) or (window >= 0 and j < pos - window):
                    continue
                x = float(np.dot(q[r, h].astype(np.float64), k[j, h // g].astype(np.float64))) * scale
                if cap > 0:
                    x = cap * math.tanh(x / cap)
                scores.append((j, x))
            m = max(s for _, s in scores)
            w = [(j, math.exp(s - m)) for j, s in scores]
            z = sum(e for _, e in w)
            out[r, h] = sum(e * v[j, h // g].astype(np.float64) for j, e in w) / z
    return out


@given(
    reqs=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 20)), min_size=1, max_size=4),
    page=st.sampled_from([1, 4, 16]),
    kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3]),
    causal=st.booleans(),
    window=st.sampled_from([-1, 0, 3]),
    cap=st.sampled_from([0.0, 5.0]),
    dims=st.sampled_from([(8, 8), (12, 8)]),
    seed=st.integers(0, 2**16),
    alloc=st.sampled_from(["contiguous", "shuffled"]),
)
def test_paged_reference_matches_naive(reqs, page, kv_heads, group, causal, window, cap, dims, seed, alloc) -> None:  # type: ignore[no-untyped-def]
    dqk, dvo = dims
    spec = BatchSpec(
        tuple(q for q, _ in reqs),
        tuple(q + e for q, e in reqs),
        page_size=page,
        num_qo_heads=kv_heads * group,
        num_kv_heads=kv_heads,
        head_dim_qk=dqk,
        head_dim_vo=dvo,
        causal=causal,
        window_left=window,
        logits_soft_cap=cap,
    )
    lay = build_paged_layout(spec, allocator=alloc, seed=seed, num_pages=spec.num_pages_needed + 3)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((spec.total_qo, spec.num_qo_heads, dqk)).astype(np.float32)
    kc = rng.standard_normal((lay.num_pages, page, kv_heads, dqk)).astype(np.float32)
    vc = rng.standard_normal((lay.num_pages, page, kv_heads, dvo)).astype(np.float32)
    got = paged_attention(q, kc, vc, lay)
    # dense per-request K/V straight from the page ids, independent of gather_paged_kv
    ragged_k, ragged_v = [], []
    for i in range(spec.batch_size):
        ids = lay.kv_indices[lay.kv_indptr[i] : lay.kv_indptr[i + 1]]
        n = spec.kv_lens[i]
        ragged_k.append(np.concatenate([kc[p] for p in ids])[:n])
        ragged_v.append(np.concatenate([vc[p] for p in ids])[:n])
    for i in range(spec.batch_size):
        q0, q1 = lay.qo_indptr[i], lay.qo_indptr[i + 1]
        want = naive(q[q0:q1], ragged_k[i], ragged_v[i], causal, spec.scale, window, cap)
        np.testing.assert_allclose(got[q0:q1], want, rtol=2e-4, atol=2e-5)
    rag = ragged_attention(q, np.concatenate(ragged_k), np.concatenate(ragged_v), build_ragged_layout(spec))
    np.testing.assert_allclose(rag, got, rtol=1e-5, atol=1e-6)


def test_padded_rows_are_zero_and_real_rows_unchanged() -> None:
    spec = BatchSpec((1, 2), (5, 9), page_size=4, num_qo_heads=2, num_kv_heads=1, head_dim_qk=8, head_dim_vo=8)
    lay = build_paged_layout(spec, pad_to=4, padding="vllm_legacy")
    rng = np.random.default_rng(0)
    q = rng.standard_normal((lay.total_qo_rows, 2, 8)).astype(np.float32)
    kc = rng.standard_normal((lay.num_pages, 4, 1, 8)).astype(np.float32)
    out = paged_attention(q, kc, kc, lay)
    assert np.all(out[lay.real_qo_rows() :] == 0)
    unpadded = paged_attention(q[: lay.real_qo_rows()], kc, kc, build_paged_layout(spec))
    np.testing.assert_allclose(out[: lay.real_qo_rows()], unpadded, rtol=0, atol=0)


def test_mla_reference_matches_naive_split_dims() -> None:
    rng = np.random.default_rng(1)
    spec = BatchSpec((1, 3), (6, 5), page_size=2, num_qo_heads=4, num_kv_heads=1, head_dim_qk=20, head_dim_vo=16)
    lay = build_paged_layout(spec, allocator="shuffled", seed=2)
    qn = rng.standard_normal((spec.total_qo, 4, 16)).astype(np.float32)
    qp = rng.standard_normal((spec.total_qo, 4, 4)).astype(np.float32)
    ckv = rng.standard_normal((lay.num_pages, 2, 16)).astype(np.float32)
    kpe = rng.standard_normal((lay.num_pages, 2, 4)).astype(np.float32)
    got = mla_reference(qn, qp, ckv, kpe, lay, scale=0.1)
    for i in range(2):
        ids = lay.kv_indices[lay.kv_indptr[i] : lay.kv_indptr[i + 1]]
        n = spec.kv_lens[i]
        k = np.concatenate([np.concatenate([ckv[p], kpe[p]], -1) for p in ids])[:n, None]
        v = np.concatenate([ckv[p] for p in ids])[:n, None]
        q0, q1 = lay.qo_indptr[i], lay.qo_indptr[i + 1]
        q = np.concatenate([qn[q0:q1], qp[q0:q1]], -1)
        np.testing.assert_allclose(got[q0:q1], naive(q, k, v, True, 0.1, -1, 0.0), rtol=2e-4, atol=2e-5)
