"""On CUDA the torch reference multiplies fp16/bf16 operands with fp32 accumulation (no fp32 copies of K and V):
it must agree with the numpy fp32 reference on the same (rounded) inputs as closely as the fp32 path does."""

from __future__ import annotations

import numpy as np
import pytest

from flashcheck.batch import BatchSpec
from flashcheck.layout import build_paged_layout
from flashcheck.reference import paged_attention, torch_ref
from flashcheck.reference.torch_ref import paged_attention_torch

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the low-precision path is CUDA's)")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    ("qo", "causal", "window", "cap", "mla"),
    [
        ((1, 1, 1, 1), True, -1, 0.0, False),  # decode
        ((3, 1, 5, 2), True, 7, 0.0, False),  # prefill chunks / speculative decode, sliding window
        ((2, 4), False, -1, 30.0, False),  # non-causal, logit soft cap
        ((1, 1, 1), True, -1, 0.0, True),  # MLA: V is the first columns of K, one latent head
    ],
)
def test_low_precision_reference_matches_fp32(
    dtype: str, qo: tuple[int, ...], causal: bool, window: int, cap: float, mla: bool
) -> None:
    rng = np.random.default_rng(len(qo))
    kv = tuple(q + int(e) for q, e in zip(qo, rng.integers(0, 300, len(qo)), strict=True))
    dqk, dvo, kh = (24, 16, 1) if mla else (32, 32, 2)
    spec = BatchSpec(
        qo,
        kv,
        page_size=16,
        num_qo_heads=8,
        num_kv_heads=kh,
        head_dim_qk=dqk,
        head_dim_vo=dvo,
        causal=causal,
        window_left=window,
        logits_soft_cap=cap,
        q_dtype=dtype,
        kv_dtype=dtype,
    )
    lay = build_paged_layout(spec, allocator="shuffled", seed=3, pad_to=spec.batch_size + 1, padding="vllm_legacy")
    dt = getattr(torch, dtype)
    q = torch.randn((lay.total_qo_rows, 8, dqk), dtype=dt, device="cuda")
    k = torch.randn((lay.num_pages, 16, kh, dqk), dtype=dt, device="cuda")
    v = k[..., :dvo] if mla else torch.randn((lay.num_pages, 16, kh, dvo), dtype=dt, device="cuda")
    want = paged_attention(*(x.float().cpu().numpy() for x in (q, k, v)), lay)
    rows = lay.real_qo_rows()
    torch_ref._LOW_PRECISION.pop("cuda", None)
    got = paged_attention_torch(q, k, v, lay).cpu().numpy()
    assert torch_ref._LOW_PRECISION.get("cuda") is True, "torch.bmm(out_dtype=float32) is missing on this CUDA torch"
    # the fp32 path, for the size of error that fp32 math itself makes
    torch_ref._LOW_PRECISION["cuda"] = False
    try:
        fp32 = paged_attention_torch(q, k, v, lay).cpu().numpy()
    finally:
        torch_ref._LOW_PRECISION.pop("cuda", None)
    np.testing.assert_allclose(fp32[:rows], want[:rows], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[:rows], want[:rows], rtol=1e-4, atol=1e-5)
    assert not got[rows:].any()


def test_graphed_reference_replays_match_numpy() -> None:
    """The driver's reference: the same padded shape seen again is replayed from a graph; every call, eager or
    replayed, agrees with numpy on its own batch (a stale static input would fail a later one)."""
    from flashcheck.reference.graphed import GraphedReference

    k = torch.randn((600, 16, 2, 32), dtype=torch.float16, device="cuda")
    v = torch.randn((600, 16, 2, 32), dtype=torch.float16, device="cuda")
    ref = GraphedReference(k, v)
    rng = np.random.default_rng(7)
    kh, vh = k.float().cpu().numpy(), v.float().cpu().numpy()
    for i in range(8):
        bs = int(rng.integers(5, 9))  # one padded batch size (8) and one page count (next power of two of 16)
        qo = (2, *(int(x) for x in rng.integers(1, 3, bs - 1)))  # two query rows at most: padded to 2
        kv = tuple(int(x) + q for x, q in zip(rng.integers(200, 240, bs), qo, strict=True))  # 13..16 pages
        spec = BatchSpec(
            qo,
            kv,
            page_size=16,
            num_qo_heads=8,
            num_kv_heads=2,
            head_dim_qk=32,
            head_dim_vo=32,
            q_dtype="float16",
            kv_dtype="float16",
        )
        lay = build_paged_layout(spec, num_pages=600, allocator="shuffled", seed=i)
        q = torch.randn((lay.total_qo_rows, 8, 32), dtype=torch.float16, device="cuda")
        got = ref(q, lay).cpu().numpy()
        want = paged_attention(q.float().cpu().numpy(), kh, vh, lay)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"call {i}")
    assert ref.graphs.captures >= 1 and ref.graphs.replays >= 1, (ref.graphs.captures, ref.graphs.replays)
