"""The torch reference (used on the GPU) agrees with the numpy reference, on its one-shot and its per-request path,
and so does the driver's padded reference (`reference.graphed`, run eagerly on CPU)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashcheck.batch import BatchSpec
from flashcheck.layout import build_paged_layout
from flashcheck.reference import paged_attention, torch_ref
from flashcheck.reference.graphed import GraphedReference
from flashcheck.reference.torch_ref import paged_attention_torch

torch = pytest.importorskip("torch")


@given(
    reqs=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 40)), min_size=1, max_size=5),
    decode=st.booleans(),
    page=st.sampled_from([1, 4, 16]),
    group=st.sampled_from([1, 4]),
    window=st.sampled_from([-1, 5]),
    cap=st.sampled_from([0.0, 8.0]),
    causal=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_torch_reference_matches_numpy(reqs, decode, page, group, window, cap, causal, seed) -> None:  # type: ignore[no-untyped-def]
    qo = tuple(1 if decode else q for q, _ in reqs)
    spec = BatchSpec(
        qo,
        tuple(q + e for q, (_, e) in zip(qo, reqs, strict=True)),
        page_size=page,
        num_qo_heads=2 * group,
        num_kv_heads=2,
        head_dim_qk=8,
        head_dim_vo=8,
        causal=causal,
        window_left=window,
        logits_soft_cap=cap,
        q_dtype="float32",
        kv_dtype="float32",
    )
    lay = build_paged_layout(
        spec,
        allocator="shuffled",
        seed=seed,
        pad_to=spec.batch_size + 1,
        padding="vllm_legacy" if page > 1 else "sglang",
    )
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((lay.total_qo_rows, spec.num_qo_heads, 8)).astype(np.float32)
    kc = rng.standard_normal((lay.num_pages, page, 2, 8)).astype(np.float32)
    vc = rng.standard_normal((lay.num_pages, page, 2, 8)).astype(np.float32)
    want = paged_attention(q, kc, vc, lay)
    rows = lay.real_qo_rows()
    limit = torch_ref._BATCHED_ELEMENTS
    try:
        for batched in (limit, 0):  # the one-shot path, then request by request (what too large a batch takes)
            torch_ref._BATCHED_ELEMENTS = batched
            got = paged_attention_torch(torch.from_numpy(q), torch.from_numpy(kc), torch.from_numpy(vc), lay).numpy()
            np.testing.assert_allclose(got[:rows], want[:rows], rtol=1e-4, atol=1e-5)
            assert not got[rows:].any()  # padded rows stay 0
    finally:
        torch_ref._BATCHED_ELEMENTS = limit
    unpadded = build_paged_layout(spec, allocator="shuffled", seed=seed)  # the padded reference takes real rows only
    rows = unpadded.real_qo_rows()
    got = GraphedReference(torch.from_numpy(kc), torch.from_numpy(vc))(torch.from_numpy(q[:rows]), unpadded).numpy()
    np.testing.assert_allclose(got, paged_attention(q[:rows], kc, vc, unpadded), rtol=1e-4, atol=1e-5)
