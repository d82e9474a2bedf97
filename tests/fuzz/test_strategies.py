"""Strategies: shapes fit the capacity, edge cases are drawn on purpose, parameters shrink to the simplest batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from flashcheck.batch import BatchSpec
from flashcheck.errors import InvalidArgument
from flashcheck.fuzzing.options import Budget, parse_budget
from flashcheck.fuzzing.strategies import (
    LengthParams,
    batch_sizes,
    batch_specs,
    burst_params,
    capacity_for,
    capture_params,
    lengths_for,
    scenarios,
    steps,
    templates,
)
from flashcheck.targets.protocol import Capacity
from flashcheck.targets.reference import ReferenceTarget

CAP = ReferenceTarget(max_kv_len=512, max_pages=128).capacity


@settings(max_examples=60)
@given(batch_specs(CAP))
def test_batch_specs_fit_the_capacity(spec: BatchSpec) -> None:
    assert 1 <= spec.batch_size <= CAP.max_batch_size
    assert max(spec.kv_lens) <= CAP.max_kv_len and max(spec.qo_lens) <= CAP.max_qo_len
    assert spec.num_pages_needed + 1 <= CAP.max_pages and spec.total_qo <= CAP.max_total_qo


@settings(max_examples=40)
@given(batch_specs(templates(), max_batch=16, max_kv=512))
def test_templates_give_valid_head_configs(spec: BatchSpec) -> None:
    ratio = spec.num_qo_heads // spec.num_kv_heads
    if spec.head_dim_qk == 576:
        assert (spec.head_dim_vo, spec.num_kv_heads) == (512, 1)
    else:
        assert spec.head_dim_qk in (64, 128, 256) and 1 <= ratio <= 16
    assert spec.page_size in (1, 16, 32, 64) and spec.batch_size <= 16


def test_page_boundary_edge_puts_lengths_on_page_boundaries() -> None:
    p = LengthParams("uniform", 64, seed=7, kv_cap=512, edges=frozenset({"page_boundary"}))
    _, kv = lengths_for(capacity_for(BatchSpec((1,), (1,), page_size=16), max_batch=64, max_kv=512), p)
    near = [k for k in kv if k % 16 in (15, 0, 1)]
    assert len(near) >= 20, kv  # about half the rows are k*16 and +-1; uniform alone gives ~3/16


def test_max_kv_and_full_pool_edges_reach_the_limits() -> None:
    cap = capacity_for(BatchSpec((1,), (1,), page_size=16), max_batch=8, max_kv=1024)
    _, kv = lengths_for(cap, LengthParams("decode_heavy", 4, 3, 8, frozenset({"max_kv"})))
    assert max(kv) == 1024
    pool = Capacity(template=cap.template, max_batch_size=8, max_pages=100, max_kv_len=1024)
    _, kv = lengths_for(pool, LengthParams("decode_heavy", 8, 3, 8, frozenset({"full_pool"})))
    pages = sum(-(-k // 16) for k in kv)
    assert 80 <= pages <= 98, kv  # nearly full, still fits (one spare page for padding rows)


def test_batch_sizes_draw_bucket_edges() -> None:
    seen: set[int] = set()

    @settings(max_examples=200, database=None)
    @given(batch_sizes(CAP))
    def collect(n: int) -> None:
        seen.add(n)

    collect()
    assert {1, 2, 3, 5, 8} <= seen  # 1, buckets and one above each bucket (most padded rows)


def test_shrinks_to_the_simplest_batch() -> None:
    spec = find(batch_specs(CAP), lambda s: s.batch_size >= 3, settings=settings(database=None))
    assert spec.batch_size == 3
    assert max(spec.kv_lens) <= 8  # the smallest length cap


@settings(max_examples=30)
@given(steps(CAP))
def test_steps_respect_buckets(step: object) -> None:
    from flashcheck.scenario import Step

    assert isinstance(step, Step)
    if step.op != "eager":
        assert step.bucket in CAP.buckets and len(step.qo_lens) <= step.bucket


@settings(max_examples=40)
@given(capture_params(CAP), st.integers(1, 7))
def test_capture_params_fit_their_bucket_and_bursts_stay_in_it(bp: tuple[int, LengthParams], i: int) -> None:
    bucket, p = bp
    assert bucket in CAP.buckets and 1 <= p.batch_size <= bucket
    below = max([b for b in CAP.buckets if b < CAP.bucket_for(p.batch_size)], default=0)
    nxt = burst_params(CAP, p, i)
    # the same bucket serves the follow-on batch, drawn from the same distribution with its own seed
    assert CAP.bucket_for(nxt.batch_size) == CAP.bucket_for(p.batch_size) and below < nxt.batch_size
    assert (nxt.distribution, nxt.kv_cap, nxt.edges) == (p.distribution, p.kv_cap, p.edges) and nxt.seed != p.seed
    assert burst_params(CAP, p, i) == nxt and burst_params(CAP, p, 0) is p  # deterministic; i == 0 is p


def test_capture_params_shrink_to_the_smallest_bucket_and_reject_no_buckets() -> None:
    bucket, p = find(capture_params(CAP), lambda bp: True, settings=settings(database=None))
    assert bucket == CAP.buckets[0] and p.batch_size == 1
    with pytest.raises(InvalidArgument, match="buckets"):
        capture_params(capacity_for(CAP.template))


@settings(max_examples=10)
@given(scenarios(ReferenceTarget(max_kv_len=512, max_pages=128), max_steps=5))
def test_scenarios_capture_every_bucket_first_and_round_trip(sc: object) -> None:
    from flashcheck.scenario import Scenario

    assert isinstance(sc, Scenario)
    assert [s.bucket for s in sc.steps[: len(CAP.buckets)]] == list(CAP.buckets)
    assert Scenario.from_dict(sc.to_dict()) == sc


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("200", Budget(examples=200)),
        (7, Budget(examples=7)),
        ("30s", Budget(seconds=30.0)),
        ("1.5m", Budget(seconds=90.0)),
        ("1h", Budget(seconds=3600.0)),
        (2.5, Budget(seconds=2.5)),
    ],
)
def test_parse_budget(raw: object, want: Budget) -> None:
    assert parse_budget(raw) == want  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["", "abc", "1.5", "0", "-3s", True])
def test_parse_budget_rejects(raw: object) -> None:
    with pytest.raises(InvalidArgument):
        parse_budget(raw)  # type: ignore[arg-type]


def test_unknown_distribution_is_an_error_naming_the_choices() -> None:
    with pytest.raises(InvalidArgument, match="uniform"):
        batch_specs(CAP, distributions=["zipf"])


def test_lengths_are_bulk_numpy_and_deterministic() -> None:
    cap = capacity_for(BatchSpec((1,), (1,)), max_batch=256, max_kv=4096)
    p = LengthParams("production", 256, 11, 4096, frozenset({"single_token"}))
    a, b = lengths_for(cap, p), lengths_for(cap, p)
    assert a == b and len(a[0]) == 256 and np.all(np.asarray(a[1]) >= np.asarray(a[0]))


def test_strategies_reject_bad_inputs() -> None:
    with pytest.raises(InvalidArgument):
        batch_sizes(CAP, min_batch=9)
    with pytest.raises(InvalidArgument):
        steps(capacity_for(BatchSpec((1,), (1,))), ops=("replay",))
    with pytest.raises(InvalidArgument):
        templates(head_dims=())
    with pytest.raises(InvalidArgument, match="pool"):  # more requests than pages: an error, never a hang
        lengths_for(CAP, LengthParams("uniform", 256, 0, 8))
    _ = st  # strategies module is the public surface under test
