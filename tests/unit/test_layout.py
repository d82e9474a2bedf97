"""Layout builder: padding policies, allocators and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from flashcheck.batch import BatchSpec
from flashcheck.errors import InvalidArgument
from flashcheck.layout import PagedLayout, build_paged_layout, build_ragged_layout

SPEC = BatchSpec((1, 3), (17, 32), page_size=16)


def test_vllm_legacy_padding() -> None:
    lay = build_paged_layout(SPEC, pad_to=4, padding="vllm_legacy")
    assert lay.kv_indptr.tolist() == [0, 2, 4, 4, 4]
    assert lay.kv_last_page_len.tolist() == [1, 16, 1, 1]
    assert lay.qo_indptr.tolist() == [0, 1, 4, 5, 6]
    assert lay.seq_lens.tolist() == [17, 32, 0, 0]


def test_vllm_current_padding() -> None:
    lay = build_paged_layout(SPEC, pad_to=4, padding="vllm_current")
    assert lay.kv_indptr.tolist() == [0, 2, 4, 4, 4]
    assert lay.kv_last_page_len.tolist() == [1, 16, 0, 0]
    assert lay.qo_indptr.tolist() == [0, 1, 4, 4, 4]


def test_sglang_padding_attends_one_stale_token() -> None:
    spec = BatchSpec((1, 1), (3, 2), page_size=1)
    lay = build_paged_layout(spec, pad_to=4, padding="sglang")
    assert lay.kv_indptr.tolist() == [0, 3, 5, 6, 7]
    assert lay.seq_lens.tolist() == [3, 2, 1, 1]
    assert lay.kv_indices[5:].tolist() == [lay.num_pages - 1] * 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pad_to": 1}, "pad_to=1 is smaller than the batch size 2"),
        ({"pad_to": 4}, "needs a padding policy"),
        ({"pad_to": 4, "padding": "sglang"}, "needs page_size 1"),
        ({"padding": "trtllm"}, "unknown padding policy 'trtllm'"),
        ({"allocator": "buddy"}, "unknown page allocator 'buddy'"),
        ({"num_pages": 2}, "num_pages=2 cannot hold the 4 pages"),
    ],
)
def test_bad_builder_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        build_paged_layout(SPEC, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("alloc", ["contiguous", "shuffled", "fragmented"])
def test_allocators_give_distinct_pages_in_pool(alloc: str) -> None:
    spec = BatchSpec((1,) * 20, tuple(range(1, 400, 20)), page_size=16)
    lay = build_paged_layout(spec, allocator=alloc, num_pages=400, seed=5)
    used = lay.kv_indices
    assert len(set(used.tolist())) == len(used) == spec.num_pages_needed
    assert used.min() >= 0 and used.max() < 400


def test_layout_json_round_trip() -> None:
    lay = build_paged_layout(SPEC, pad_to=3, padding="vllm_current", allocator="shuffled")
    again = PagedLayout.from_dict(lay.to_dict())
    for k, v in lay.arrays().items():
        np.testing.assert_array_equal(v, again.arrays()[k])
    assert again.padding == lay.padding and again.spec == lay.spec
    with pytest.raises(InvalidArgument, match="lacks field"):
        PagedLayout.from_dict({"spec": SPEC.to_dict()})


def test_ragged_layout() -> None:
    lay = build_ragged_layout(SPEC)
    assert lay.qo_indptr.tolist() == [0, 1, 4] and lay.kv_indptr.tolist() == [0, 17, 49]
