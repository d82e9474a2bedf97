"""FC303's two comparisons agree: the device-side screen (`any_violation`) fires exactly when the host comparison
(`compare_outputs`) reports a finding, so a replay the screen passes is one the full comparison would pass too."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashcheck.properties.equivalence import Tolerance, any_violation, compare_outputs

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
