"""Unit tests for the keyword plumbing; run on one GPU."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from kwstack.middleware import build_capture_stack
from kwstack.plan_kwargs import bind_plan_arguments, make_decode_wrapper, split_plan_run_kwargs

TEST_WORKSPACE_BYTES = 32 << 20


@pytest.fixture
def wrapper():
    workspace = torch.empty(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    return make_decode_wrapper(workspace, "NHD", backend="fa2")


def test_split_plan_run_kwargs():
    q = torch.randn(4, 32, 128, device="cuda")
    plan_kw, run_kw = split_plan_run_kwargs({"indptr": torch.arange(5, dtype=torch.int32), "q": q})
    assert set(plan_kw) == {"indptr"}  # ok: FC109
    assert run_kw["q"] is q


def test_bind_plan_arguments_positional():
    indptr = torch.arange(5, dtype=torch.int32, device="cuda")
    args = bind_plan_arguments(indptr, torch.arange(4, dtype=torch.int32, device="cuda"))
    assert args["indptr"][-1].item() == 4  # ok: FC101


def test_plan_roundtrip(wrapper):
    assert isinstance(wrapper, BatchDecodeWithPagedKVCacheWrapper)
    ws = torch.zeros(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    other = make_decode_wrapper(ws, "NHD")
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32)
    indices = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    last = torch.ones(2, dtype=torch.int32)
    other.plan(indptr, indices, last, 32, 8, 128, 1)


def test_capture_stack_forwards_kwargs():
    seen = {}

    def fn(fb, **kwargs):
        seen.update(kwargs)
        return fb

    stack = build_capture_stack(fn)
    assert stack("batch", trace_id="t") == "batch"
    assert seen == {"capturing": True}
