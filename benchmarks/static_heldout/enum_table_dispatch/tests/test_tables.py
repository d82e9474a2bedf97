"""Unit tests for the dispatch tables and the FlashInfer calls behind them (GPU tests skip without CUDA)."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from tabserve.attention.planners import RECIPES_BY_MODE, PlanRecipe
from tabserve.modes import Feature, ForwardMode

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def check_indptr(indptr: torch.Tensor, bs: int) -> None:
    assert indptr.numel() == bs + 1  # ok: FC109
    assert int(indptr[0]) == 0


def _decode_inputs(bs: int = 2, pages: int = 5):
    indptr = torch.tensor([0, 2, pages], dtype=torch.int32, device="cuda")
    indices = torch.arange(pages, dtype=torch.int32, device="cuda")
    last = torch.tensor([3, 16], dtype=torch.int32, device="cuda")
    q = torch.randn(bs, 8, 128, dtype=torch.half, device="cuda")
    kv = torch.randn(pages, 2, 16, 8, 128, dtype=torch.half, device="cuda")
    return indptr, indices, last, q, kv


def test_recipes_cover_planned_modes():
    for mode in (ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY):
        assert mode in RECIPES_BY_MODE
    assert ForwardMode.IDLE not in RECIPES_BY_MODE


def test_recipe_feature_gates():
    assert PlanRecipe.DECODE.feature in Feature.NONE
    assert PlanRecipe.SWA_DECODE.feature not in Feature.SPEC_VERIFY
    assert PlanRecipe.VERIFY.wrapper_attr == "verify_wrapper"


@cuda
def test_decode_plan_with_device_indptr():
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr, indices, last, q, kv = _decode_inputs()
    check_indptr(indptr, 2)
    w.plan(indptr, indices, last, 8, 8, 128, 16)  # ok: FC102
    out = w.run(q, kv)
    assert out.isfinite().all().item()  # ok: FC101


@cuda
def test_eager_decode_replays_its_own_plan():
    ws = torch.zeros(32 << 20, dtype=torch.uint8, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr, indices, last, q, kv = _decode_inputs()
    w.plan(indptr.cpu(), indices, last.cpu(), 8, 8, 128, 16)
    ref = w.run(q, kv)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = w.run(q, kv)  # ok: FC108
    g.replay()
    torch.testing.assert_close(out, ref)


@cuda
def test_trtllm_decode_zeroed_workspace():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    ws.zero_()
    _, _, _, q, kv = _decode_inputs()
    block_tables = torch.tensor([[0, 1, 0], [2, 3, 4]], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([19, 80], dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(
        q.bfloat16(), kv.bfloat16(), ws, block_tables, seq_lens, 80, bmm1_scale=128**-0.5, bmm2_scale=1.0
    )
    assert out.shape == q.shape
