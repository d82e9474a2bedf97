"""FC303's two comparisons agree: the device-side screen (`any_violation`) fires exactly when the host comparison
(`compare_outputs`) reports a finding, so a replay the screen passes is one the full comparison would pass too."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashcheck.findings import Location
from flashcheck.properties.equivalence import Tolerance, any_violation, compare_outputs, tolerance_for

torch = pytest.importorskip("torch")

TOL = Tolerance(2e-2, 2e-2)


def host_finds(got: np.ndarray, want: np.ndarray, rows: int) -> list:  # type: ignore[type-arg]
    return compare_outputs(got[:rows], want[:rows], tol=TOL, what="replay vs reference", row_to_request=np.arange(rows))


@given(
    rows=st.integers(1, 6),
    extra=st.integers(0, 2),
    seed=st.integers(0, 10_000),
    kind=st.sampled_from(["none", "within", "beyond", "nan", "inf", "padded-row"]),
)
def test_device_screen_agrees_with_the_host_comparison(rows: int, extra: int, seed: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    want = rng.standard_normal((rows + extra, 3, 4)).astype(np.float32)
    got = want.copy()
    r, h, c = int(rng.integers(rows)), int(rng.integers(3)), int(rng.integers(4))
    limit = TOL.atol + TOL.rtol * abs(float(want[r, h, c]))
    if kind == "within":
        got[r, h, c] += 0.5 * limit
    elif kind == "beyond":
        got[r, h, c] += 3 * limit
    elif kind == "nan":
        got[r, h, c] = np.nan
    elif kind == "inf":
        got[r, h, c] = np.inf
    elif kind == "padded-row" and extra:
        got[rows:] = np.nan  # rows past the real ones are garbage by design and never compared
    screen = bool(any_violation(torch.from_numpy(got), torch.from_numpy(want), tol=TOL, rows=rows))
    found = host_finds(got, want, rows)
    assert screen == bool(found)
    assert screen == (kind in ("beyond", "nan", "inf"))
    if found:
        assert found[0].id == "FC303" and found[0].evidence["row"] == r


# ---- the boundaries of the comparison, pinned -------------------------------------------------------------------
EDGE = Tolerance(0.25, 0.5)  # powers of two: the limit for want=1.0 is exactly 0.75


def one(got: float, want: float = 1.0, tol: Tolerance = EDGE) -> list:  # type: ignore[type-arg]
    g, w = np.full((1, 1, 1), got), np.full((1, 1, 1), want)
    return compare_outputs(g, w, tol=tol, what="replay vs eager", row_to_request=[0])


def test_a_difference_equal_to_the_limit_passes_and_one_beyond_fails() -> None:
    assert one(1.75) == [] and one(0.25) == []  # |diff| == atol + rtol * |want|
    assert len(one(1.8125)) == 1 and len(one(0.1875)) == 1
    got, want = torch.full((2, 1, 1), 1.75), torch.ones(2, 1, 1)
    assert not bool(any_violation(got, want, tol=EDGE, rows=2))
    assert bool(any_violation(got + 0.0625, want, tol=EDGE, rows=2))
    assert not bool(any_violation(torch.cat([got[:1], got[:1] * 9]), want, tol=EDGE, rows=1))  # past `rows`


def test_both_sides_are_compared_in_float32() -> None:
    exact = Tolerance(0.0, 0.0)
    assert one(1.0 + 1e-9, 1.0, exact) == []  # below float32 resolution on either side
    assert one(1.0, 1.0 + 1e-9, exact) == []
    assert len(one(1.0 + 1e-6, 1.0, exact)) == 1


def test_an_empty_output_passes_and_a_single_element_is_compared() -> None:
    empty = np.zeros((0, 2, 3))
    assert compare_outputs(empty, empty, tol=EDGE, what="x", row_to_request=[]) == []
    assert len(one(5.0)) == 1


def test_the_finding_names_the_worst_element_its_request_and_the_rows_that_differ() -> None:
    want = np.zeros((4, 2, 3), dtype=np.float32)
    want[3, 1, 2] = 100.0
    got = want.copy()
    got[0, 0, 1] = 1.5  # excess 1.5 - 0.25 = 1.25: the worst
    got[1, 1, 0] = 0.5  # a second row that differs (excess 0.25)
    got[3, 1, 2] = 102.0  # |diff| 2 is the largest, but its limit is 50.25: within
    (f,) = compare_outputs(
        got, want, tol=EDGE, what="replay vs eager", row_to_request=[7, 7, 8, 9], location=Location(step=2)
    )
    assert (f.id, f.name, f.kind) == ("FC303", "replay-matches-eager", "property")
    assert f.message == (
        "replay vs eager: row 0 (request 7, head 0, col 1): 1.5 vs 0 (|diff| 1.5 > tol 0.25); 2 of 4 real rows differ"
    )
    assert f.evidence == {
        "check": "values",
        "what": "replay vs eager",
        "row": 0,
        "request": 7,
        "head": 0,
        "got": 1.5,
        "want": 0.0,
        "bad_rows": 2,
        "rows": 4,
        "nonfinite": False,
    }
    assert f.location == Location(step=2) and "rewritten before replay" in f.hint


def test_the_worst_element_is_the_largest_excess_over_its_own_limit() -> None:
    want = np.array([[[0.0]], [[100.0]]], dtype=np.float32)
    got = np.array([[[1.5]], [[151.0]]], dtype=np.float32)  # excess 1.25 vs 0.75; |diff| + limit 1.75 vs 101.25
    (f,) = compare_outputs(got, want, tol=EDGE, what="w", row_to_request=[3, 4])
    assert f.evidence["row"] == 0 and f.evidence["bad_rows"] == 2
    assert f.message.endswith("(|diff| 1.5 > tol 0.25); 2 of 2 real rows differ")
    (g,) = compare_outputs(got[1:], want[1:], tol=EDGE, what="w", row_to_request=[4])
    assert "(|diff| 51 > tol 50.2)" in g.message  # the tolerance printed is atol + rtol * |want|


def test_a_nonfinite_element_is_the_worst_and_is_flagged() -> None:
    want = np.zeros((2, 1, 2), dtype=np.float32)
    got = want.copy()
    got[0, 0, 0] = 1000.0
    got[1, 0, 1] = np.nan
    (f,) = compare_outputs(got, want, tol=EDGE, what="w", row_to_request=[0, 1])
    assert (f.evidence["row"], f.evidence["head"], f.evidence["nonfinite"]) == (1, 0, True)
    assert f.message.startswith("w: row 1 (request 1, head 0, col 1): nan vs 0")


def test_a_shape_mismatch_is_one_finding_that_names_both_shapes() -> None:
    (f,) = compare_outputs(
        np.zeros((3, 2, 4)), np.zeros((2, 2, 4)), tol=EDGE, what="eager vs reference", row_to_request=[0, 1]
    )
    assert (f.id, f.kind) == ("FC303", "property")
    assert f.message == "eager vs reference: output shape (3, 2, 4) != expected (2, 2, 4)"
    assert f.evidence == {
        "check": "shape",
        "got_shape": [3, 2, 4],
        "want_shape": [2, 2, 4],
        "what": "eager vs reference",
    }
    assert f.location == Location() and f.hint


@pytest.mark.parametrize(
    ("q", "kv", "atol"),
    [
        ("float16", "float16", 2e-2),
        ("bfloat16", "float16", 5e-2),
        ("float16", "bfloat16", 5e-2),
        ("float16", "float8_e4m3fn", 1.5e-1),
        ("float32", "float32", 1e-4),
        ("float32", "int4", 2e-2),  # an unknown dtype counts as float16
        ("int4", "float32", 2e-2),
    ],
)
def test_tolerance_is_the_looser_of_the_two_dtypes(q: str, kv: str, atol: float) -> None:
    assert tolerance_for(q, kv) == Tolerance(atol, atol)


def test_of_several_nonfinite_elements_the_first_is_the_worst() -> None:
    want = np.zeros((2, 1, 1), dtype=np.float32)
    got = np.array([[[np.inf]], [[np.nan]]], dtype=np.float32)
    (f,) = compare_outputs(got, want, tol=EDGE, what="w", row_to_request=[0, 1])
    assert f.evidence["row"] == 0 and f.evidence["bad_rows"] == 2
