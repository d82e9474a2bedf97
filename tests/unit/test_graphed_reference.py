"""The driver's padded reference (power-of-two shapes, graphed on CUDA) agrees with the numpy reference; on CPU it
runs the same padded path eagerly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashcheck.batch import BatchSpec
from flashcheck.layout import build_paged_layout
from flashcheck.reference import paged_attention
from flashcheck.reference.graphed import GraphedReference, _pow2

torch = pytest.importorskip("torch")


def test_pow2() -> None:
    assert [_pow2(n) for n in (1, 2, 3, 4, 5, 31, 32, 33)] == [1, 2, 4, 4, 8, 32, 32, 64]


@settings(max_examples=40, deadline=None)
@given(
    reqs=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 40)), min_size=1, max_size=6),
    decode=st.booleans(),
    page=st.sampled_from([1, 4, 16]),
    group=st.sampled_from([1, 4]),
    window=st.sampled_from([-1, 5]),
    cap=st.sampled_from([0.0, 8.0]),
    causal=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_padded_reference_matches_numpy(reqs, decode, page, group, window, cap, causal, seed) -> None:  # type: ignore[no-untyped-def]
    qo = tuple(1 if decode else q for q, _ in reqs)
    spec = BatchSpec(qo, tuple(q + e for q, (_, e) in zip(qo, reqs, strict=True)), page_size=page,
                     num_qo_heads=2 * group, num_kv_heads=2, head_dim_qk=8, head_dim_vo=8, causal=causal,
                     window_left=window, logits_soft_cap=cap, q_dtype="float32", kv_dtype="float32")
    lay = build_paged_layout(spec, allocator="shuffled", seed=seed)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((lay.total_qo_rows, spec.num_qo_heads, 8)).astype(np.float32)
    kc = rng.standard_normal((lay.num_pages, page, 2, 8)).astype(np.float32)
    vc = rng.standard_normal((lay.num_pages, page, 2, 8)).astype(np.float32)
    want = paged_attention(q, kc, vc, lay)
    ref = GraphedReference(torch.from_numpy(kc), torch.from_numpy(vc))
    got = ref(torch.from_numpy(q), lay).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_padded_reference_fires_on_a_wrong_page() -> None:
    """The padded path reads the layout's pages: a layout pointing a request at another page changes the result."""
    spec = BatchSpec((1, 1), (20, 9), page_size=4, num_qo_heads=2, num_kv_heads=2, head_dim_qk=8, head_dim_vo=8,
                     q_dtype="float32", kv_dtype="float32")
    lay = build_paged_layout(spec, allocator="shuffled", seed=1)
    rng = np.random.default_rng(0)
    q = torch.from_numpy(rng.standard_normal((2, 2, 8)).astype(np.float32))
    kc = torch.from_numpy(rng.standard_normal((lay.num_pages + 1, 4, 2, 8)).astype(np.float32))
    ref = GraphedReference(kc, kc)
    good = ref(q, lay).clone()
    lay.kv_indices[0] = lay.num_pages  # an unused page
    assert not torch.allclose(ref(q, lay), good)
