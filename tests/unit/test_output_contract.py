"""FC305: the output is exactly [real rows, heads, head_dim_vo] in the query dtype on the KV cache's device; one
finding lists every way it breaks that, and an exact output is quiet."""

from __future__ import annotations

from typing import Any

import pytest

from flashcheck.findings import Location
from flashcheck.properties.output_contract import check_output_contract


def check(shape: Any, dtype: Any = "torch.float16", device: Any = "cuda:0", **kw: Any) -> list[Any]:
    args: dict[str, Any] = dict(rows=5, heads=4, head_dim=16, want_dtype="float16", want_device="cuda", what="replay")
    args.update(kw)
    return check_output_contract(shape, dtype, device, **args)


@pytest.mark.parametrize(
    ("shape", "dtype", "device"),
    [
        ((5, 4, 16), "torch.float16", "cuda:0"),
        ([5, 4, 16], "float16", "cuda"),  # a list shape, a dtype without the torch. prefix
        ((5, 4, 16), "torch.float16", "cuda:1"),  # another index of the same device type
        ((5, 4, 16), None, None),  # dtype and device unknown: only the shape is checked
    ],
)
def test_quiet_on_an_exact_output(shape: Any, dtype: Any, device: Any) -> None:
    assert check(shape, dtype, device) == []


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((6, 4, 16), "replay output has shape [6, 4, 16], expected [5, 4, 16] (+1 rows)"),
        ((4, 4, 16), "replay output has shape [4, 4, 16], expected [5, 4, 16] (-1 rows)"),
        ((5, 3, 16), "replay output has shape [5, 3, 16], expected [5, 4, 16]"),
        ((5, 4, 8), "replay output has shape [5, 4, 8], expected [5, 4, 16]"),
        ((5, 64), "replay output has shape [5, 64], expected [5, 4, 16]"),
        ((5, 4, 16, 1), "replay output has shape [5, 4, 16, 1], expected [5, 4, 16]"),
    ],
)
def test_each_wrong_shape_is_named_with_the_row_difference_when_only_rows_differ(shape: Any, message: str) -> None:
    (f,) = check(shape)
    assert f.message == message


def test_every_problem_is_listed_in_one_finding_with_its_evidence() -> None:
    (f,) = check((6, 4, 16), "torch.float32", "cpu", what="eager", location=Location(step=3))
    assert (f.id, f.name, f.kind) == ("FC305", "output-contract", "property")
    assert f.message == (
        "eager output has shape [6, 4, 16], expected [5, 4, 16] (+1 rows); has dtype float32, expected float16; "
        "is on cpu, expected cuda"
    )
    assert f.location == Location(step=3)
    assert f.hint
    assert f.evidence == {
        "check": "output",
        "what": "eager",
        "shape": [6, 4, 16],
        "expected_shape": [5, 4, 16],
        "dtype": "torch.float32",
        "device": "cpu",
    }


def test_not_a_tensor() -> None:
    (f,) = check(None, None, None)
    assert f.message == "replay output is not a tensor"
    assert f.evidence["shape"] is None and f.location == Location()


def test_device_index_of_the_wanted_device_is_ignored() -> None:
    assert check((5, 4, 16), "torch.float16", "cuda", want_device="cuda:0") == []
    (f,) = check((5, 4, 16), "torch.float16", "cpu", want_device="cuda:0")
    assert f.message == "replay output is on cpu, expected cuda:0"
