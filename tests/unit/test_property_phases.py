"""The phase entry points of FC301, FC303, FC304 and FC305, which the driver calls with an observation: each passes
the observation's own fields (real rows, heads, dtypes, device, bucket, location) to its check, fires on a broken
observation and stays quiet on a sound one or on one with nothing exposed."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from flashcheck.batch import BatchSpec
from flashcheck.findings import Location
from flashcheck.layout import PagedLayout, build_paged_layout
from flashcheck.properties.csr import ON_GRAPH_BUFFERS, ON_PLAN_INPUTS, CsrInput
from flashcheck.properties.output_contract import ON_OUTPUT
from flashcheck.properties.phases import AfterPlan, BeforeReplay, Compare, OnOutput
from flashcheck.properties.plan_info import BEFORE_REPLAY

WHERE = Location(target="t", step=4, region="capture")
# request rows 0-1, 2 and 3-5; GQA and an MLA-like head_dim_vo != head_dim_qk, so each field is told apart
SPEC = BatchSpec((2, 1, 3), (5, 40, 17), page_size=16, num_qo_heads=4, num_kv_heads=2, head_dim_qk=24, head_dim_vo=16)


def layout(spec: BatchSpec = SPEC) -> PagedLayout:
    return build_paged_layout(spec, pad_to=5, padding="vllm_legacy", allocator="shuffled", seed=3)


def metadata(lay: PagedLayout, **over: Any) -> CsrInput:
    d: dict[str, Any] = {k: v.copy() for k, v in lay.arrays().items()}
    d.update(num_pages=lay.num_pages, page_size=lay.page_size, batch_size=lay.batch_size, padding=lay.padding)
    d.update(over)
    return CsrInput(**d)


def replay_obs(meta: CsrInput | None = None, captured: Any = None, current: Any = None) -> BeforeReplay:
    return BeforeReplay(bucket=8, metadata=meta, captured_plan_info=captured, plan_info=current, location=WHERE)


# --- FC301 after plan and before replay


def test_after_plan_checks_the_planned_layout() -> None:
    good = layout()
    assert ON_PLAN_INPUTS.run(AfterPlan(good, WHERE)) == []
    bad = dataclasses.replace(good, kv_indices=np.full_like(good.kv_indices, good.num_pages))
    found = ON_PLAN_INPUTS.run(AfterPlan(bad, WHERE))
    assert found and {f.id for f in found} == {"FC301"} and found[0].location == WHERE


def test_before_replay_checks_the_graph_buffers_with_the_bucket_named() -> None:
    lay = layout()
    assert ON_GRAPH_BUFFERS.run(replay_obs(metadata(lay))) == []
    assert ON_GRAPH_BUFFERS.run(replay_obs(None)) == []  # the target exposes no buffers
    bad = lay.kv_indptr.copy()
    bad[2] = bad[1] - 1
    found = ON_GRAPH_BUFFERS.run(replay_obs(metadata(lay, kv_indptr=bad)))
    assert found and all(f.message.startswith("graph bs=8: ") for f in found)
    assert found[0].location == WHERE


# --- FC304 before replay


@pytest.mark.parametrize(("captured", "current"), [(None, [1, 2]), ([1, 2], None), (None, None), ([1, 2], [1, 2])])
def test_plan_info_is_quiet_when_either_side_is_unexposed_or_equal(captured: Any, current: Any) -> None:
    assert BEFORE_REPLAY.run(replay_obs(captured=captured, current=current)) == []


def test_plan_info_fires_on_a_change_with_the_bucket_and_location() -> None:
    (f,) = BEFORE_REPLAY.run(replay_obs(captured=[1, 2, 3], current=[1, 2, 4]))
    assert f.id == "FC304" and f.evidence["bucket"] == 8 and f.evidence["index"] == 2 and f.location == WHERE


# --- FC305 on each output


@dataclasses.dataclass
class Out:
    shape: tuple[int, ...]
    dtype: str = "torch.float16"


@dataclasses.dataclass
class DeviceOut(Out):
    device: str = "cuda:0"


def on_output(out: Any, what: Any = "replay", device: str = "cuda:0") -> list[Any]:
    return ON_OUTPUT.run(OnOutput(out, layout(), what, device, WHERE))


def real_shape() -> tuple[int, int, int]:
    return (layout().real_qo_rows(), SPEC.num_qo_heads, SPEC.head_dim_vo)


def test_output_of_real_rows_heads_and_head_dim_vo_in_the_query_dtype_is_quiet() -> None:
    lay = layout()
    assert lay.total_qo_rows > lay.real_qo_rows() == 6  # the padded rows must not be returned
    assert on_output(DeviceOut(real_shape())) == []
    assert on_output(Out(real_shape())) == []  # no device attribute: the KV cache's device is assumed
    assert on_output(DeviceOut(real_shape(), device="cuda:1"), device="cuda:0") == []


@pytest.mark.parametrize(
    "shape",
    [
        (lambda r, h, d: (r + 1, h, d)),  # the padded rows too
        (lambda r, h, d: (r - 1, h, d)),
        (lambda r, h, d: (r, SPEC.num_kv_heads, d)),  # KV heads instead of query heads
        (lambda r, h, d: (r, h, SPEC.head_dim_qk)),  # head_dim_qk instead of head_dim_vo
    ],
)
def test_output_of_another_shape_fires(shape: Any) -> None:
    (f,) = on_output(DeviceOut(shape(*real_shape())))
    assert f.id == "FC305" and f.evidence["expected_shape"] == list(real_shape())


def test_output_in_the_kv_dtype_fires_when_it_differs_from_the_query_dtype() -> None:
    spec = dataclasses.replace(SPEC, q_dtype="bfloat16", kv_dtype="float16")
    obs = OnOutput(DeviceOut(real_shape(), "torch.float16"), layout(spec), "eager", "cuda:0", WHERE)
    (f,) = ON_OUTPUT.run(obs)
    assert "expected bfloat16" in f.message
    assert ON_OUTPUT.run(dataclasses.replace(obs, out=DeviceOut(real_shape(), "torch.bfloat16"))) == []


def test_output_on_another_device_than_the_kv_cache_fires() -> None:
    (f,) = on_output(DeviceOut(real_shape(), device="cpu"), device="cuda:0")
    assert f.evidence["device"] == "cpu" and "expected cuda:0" in f.message


@pytest.mark.parametrize("out", [[[0.0]], np.float32(1.0).item(), type("NoDtype", (), {"shape": (6, 4, 16)})()])
def test_something_other_than_a_tensor_fires(out: Any) -> None:
    (f,) = on_output(out)
    assert "is not a tensor" in f.message and f.evidence["shape"] is None


@pytest.mark.parametrize(("what", "region"), [("eager", "run"), ("replay", "replay")])
def test_output_finding_names_the_output_and_its_region(what: str, region: str) -> None:
    (f,) = on_output(DeviceOut((1, 1, 1)), what=what)
    assert f.message.startswith(f"{what} output ") and f.evidence["what"] == what
    assert f.location == dataclasses.replace(WHERE, region=region)


# --- FC303 compare


torch = pytest.importorskip("torch")

from flashcheck.properties.equivalence import ON_COMPARE  # noqa: E402


def compare(got: Any, want: Any, spec: BatchSpec = SPEC) -> list[Any]:
    return ON_COMPARE.run(Compare(got, want, "replay vs eager", layout(spec), WHERE))


def outputs(dtype: Any = torch.float32) -> tuple[Any, Any]:
    want = torch.zeros(layout().total_qo_rows, SPEC.num_qo_heads, SPEC.head_dim_vo, dtype=dtype)
    return want.clone(), want


@pytest.mark.parametrize(("q", "kv"), [("float16", "bfloat16"), ("bfloat16", "float16")])
def test_compare_uses_the_looser_tolerance_of_the_query_and_kv_dtypes(q: str, kv: str) -> None:
    spec = dataclasses.replace(SPEC, q_dtype=q, kv_dtype=kv)  # bfloat16: atol 5e-2; float16: 2e-2
    got, want = outputs()
    got[0, 0, 0] = 3e-2
    assert compare(got, want, spec) == []
    got[0, 0, 0] = 8e-2
    assert len(compare(got, want, spec)) == 1


def test_compare_names_the_request_of_the_worst_row_and_ignores_padded_rows() -> None:
    got, want = outputs(torch.bfloat16)  # the host copy converts from a dtype numpy lacks
    rows = layout().real_qo_rows()
    got[rows:] = 100.0  # padded rows: not this batch's output
    assert compare(got, want) == []
    got[3, 1, 2] = 1.0  # first row of request 2
    (f,) = compare(got, want)
    assert (f.evidence["row"], f.evidence["request"], f.evidence["head"]) == (3, 2, 1)
    assert f.evidence["rows"] == rows and f.evidence["what"] == "replay vs eager" and f.location == WHERE
    got[rows - 1, 0, 0] = 5.0  # the last real row of request 2 is compared too
    (f,) = compare(got, want)
    assert (f.evidence["row"], f.evidence["request"], f.evidence["bad_rows"]) == (rows - 1, 2, 2)


def test_compare_of_host_arrays_and_mixed_inputs() -> None:
    got, want = outputs()
    got[1, 0, 0] = 1.0
    for g, w in [(got.numpy(), want.numpy()), (got, want.numpy()), (got.numpy().tolist(), want)]:
        (f,) = compare(g, w)
        assert (f.evidence["row"], f.evidence["request"]) == (1, 0)
    assert compare(want.numpy(), want) == [] and compare(want.numpy().tolist(), want.numpy()) == []


def screen(got: Any, want: Any) -> Any:
    assert ON_COMPARE.screen is not None
    return ON_COMPARE.screen(Compare(got, want, "replay vs eager", layout(), WHERE))


def test_device_screen_answers_compare_fully_unless_both_are_tensors_of_one_shape_and_device() -> None:
    got, want = outputs()
    assert layout().real_qo_rows() == 6
    assert bool(screen(got, want)) is False
    assert screen(got.numpy(), want) is None  # None: the property must run in full
    assert screen(got, want.numpy()) is None
    assert screen(got[:-1], want) is None
    assert screen(got, want.to("meta")) is None
    got[6, 0, 0] = 1.0  # beyond the real rows
    assert bool(screen(got, want)) is False
    got[5, 0, 0] = 1.0
    assert bool(screen(got, want)) is True
    assert compare(got, want)  # a set screen: the property finds it
