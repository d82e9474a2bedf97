"""The driver's padded reference (power-of-two shapes, graphed on CUDA): its shape rounding, and that it reads the
layout's pages (agreement with numpy is in test_torch_reference.py; replays are in tests/gpu)."""

from __future__ import annotations

import numpy as np
import pytest

from flashcheck.batch import BatchSpec
from flashcheck.layout import build_paged_layout
from flashcheck.reference.graphed import GraphedReference, _pow2

torch = pytest.importorskip("torch")


def test_pow2() -> None:
    assert [_pow2(n) for n in (1, 2, 3, 4, 5, 31, 32, 33)] == [1, 2, 4, 4, 8, 32, 32, 64]


def test_padded_reference_fires_on_a_wrong_page() -> None:
    """The padded path reads the layout's pages: a layout pointing a request at another page changes the result."""
    spec = BatchSpec(
        (1, 1),
        (20, 9),
        page_size=4,
        num_qo_heads=2,
        num_kv_heads=2,
        head_dim_qk=8,
        head_dim_vo=8,
        q_dtype="float32",
        kv_dtype="float32",
    )
    lay = build_paged_layout(spec, allocator="shuffled", seed=1)
    rng = np.random.default_rng(0)
    q = torch.from_numpy(rng.standard_normal((2, 2, 8)).astype(np.float32))
    kc = torch.from_numpy(rng.standard_normal((lay.num_pages + 1, 4, 2, 8)).astype(np.float32))
    ref = GraphedReference(kc, kc)
    good = ref(q, lay).clone()
    lay.kv_indices[0] = lay.num_pages  # an unused page
    assert not torch.allclose(ref(q, lay), good)
