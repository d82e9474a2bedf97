"""BatchSpec: validation names the field and value; JSON round-trips."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashcheck.batch import BatchSpec
from flashcheck.errors import FlashcheckError, InvalidArgument


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"qo_lens": (), "kv_lens": ()}, r"qo_lens=\(\) needs at least one request"),
        ({"qo_lens": (1, 1), "kv_lens": (3,)}, r"kv_lens=\(3,\) must have one entry per request"),
        ({"qo_lens": (0,), "kv_lens": (3,)}, r"qo_lens\[0\]=0 must be >= 1"),
        ({"qo_lens": (5,), "kv_lens": (3,)}, r"kv_lens\[0\]=3 must be >= qo_lens\[0\]=5"),
        ({"qo_lens": (1,), "kv_lens": (3,), "page_size": 0}, r"page_size=0 must be an int >= 1"),
        (
            {"qo_lens": (1,), "kv_lens": (3,), "num_qo_heads": 6, "num_kv_heads": 4},
            r"num_qo_heads=6 must be a multiple",
        ),
        ({"qo_lens": (1,), "kv_lens": (3,), "q_dtype": "fp16"}, r"q_dtype='fp16' must be one of"),
        ({"qo_lens": (1,), "kv_lens": (3,), "window_left": -2}, r"window_left=-2 must be -1"),
        ({"qo_lens": (1,), "kv_lens": (3,), "logits_soft_cap": -1.0}, r"logits_soft_cap=-1.0 must be >= 0"),
        ({"qo_lens": (1.5,), "kv_lens": (3,)}, r"qo_lens\[0\] must be an int"),
        ({"qo_lens": "12", "kv_lens": (3,)}, r"qo_lens must be a sequence of ints"),
    ],
)
def test_invalid_spec_names_field_and_value(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match) as info:
        BatchSpec(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, FlashcheckError)


def test_numpy_ints_are_accepted_and_normalized() -> None:
    spec = BatchSpec(np.array([1, 2]), np.array([5, 6]))  # type: ignore[arg-type]
    assert spec.qo_lens == (1, 2) and all(type(x) is int for x in spec.kv_lens)


def test_spec_is_immutable() -> None:
    spec = BatchSpec((1,), (3,))
    with pytest.raises(AttributeError):
        spec.page_size = 4  # type: ignore[misc]


@given(
    st.lists(st.tuples(st.integers(1, 50), st.integers(0, 500)), min_size=1, max_size=20),
    st.sampled_from([1, 16, 64]),
    st.booleans(),
    st.sampled_from([-1, 0, 31]),
)
def test_json_round_trip(reqs: list[tuple[int, int]], page: int, causal: bool, window: int) -> None:
    spec = BatchSpec(
        tuple(q for q, _ in reqs),
        tuple(q + extra for q, extra in reqs),
        page_size=page,
        causal=causal,
        window_left=window,
        logits_soft_cap=30.0,
        num_qo_heads=8,
        num_kv_heads=2,
    )
    again = BatchSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert again.pages_per_request() == tuple(-(-k // page) for k in spec.kv_lens)


def test_from_dict_rejects_unknown_and_missing_fields() -> None:
    with pytest.raises(InvalidArgument, match=r"unknown BatchSpec field\(s\) \['page'\]"):
        BatchSpec.from_dict({"qo_lens": [1], "kv_lens": [2], "page": 3})
    with pytest.raises(InvalidArgument, match=r"missing required field\(s\) \['kv_lens'\]"):
        BatchSpec.from_dict({"qo_lens": [1]})
