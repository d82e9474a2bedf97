"""GPU checks of the attention paths the asyncio engine relies on."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

WS_BYTES = 32 * 1024 * 1024
BS, PAGES, PAGE, HEADS, DIM = 4, 2, 16, 8, 128
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _decode(ws):
    q = torch.randn(BS, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(BS * PAGES, 2, HEADS, PAGE, DIM, dtype=torch.bfloat16, device="cuda")
    tables = torch.arange(BS * PAGES, dtype=torch.int32, device="cuda").view(BS, PAGES)
    lens = torch.full((BS,), PAGES * PAGE, dtype=torch.int32, device="cuda")
    return trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, PAGES * PAGE, bmm1_scale=DIM**-0.5, bmm2_scale=1.0)


def test_trtllm_decode_fresh_workspace():
    ws = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")  # expect: FC105
    assert _decode(ws).shape == (BS, HEADS, DIM)


def test_trtllm_decode_zeroed_workspaces_agree():
    zeroed = torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    filled = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    filled.fill_(0)
    cleared = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared.zero_()
    torch.testing.assert_close(_decode(zeroed), _decode(filled))
    torch.testing.assert_close(_decode(zeroed), _decode(cleared))
    torch.cuda.synchronize()  # ok: FC101


def test_fa2_plan_on_device_and_host_tensors():
    q = torch.randn(BS, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(BS * PAGES, 2, HEADS, PAGE, DIM, dtype=torch.bfloat16, device="cuda")
    indptr = torch.arange(0, (BS + 1) * PAGES, PAGES, dtype=torch.int32, device="cuda")
    indices = torch.arange(BS * PAGES, dtype=torch.int32, device="cuda")
    last = torch.full((BS,), PAGE, dtype=torch.int32, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda"), "HND")  # ok: FC106
    w.plan(indptr, indices, last, HEADS, HEADS, DIM, PAGE)  # ok: FC102
    out = w.run(q, kv)
    assert w._plan_info is not None  # ok: FC103
    ref_ws = torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    ref = BatchDecodeWithPagedKVCacheWrapper(ref_ws, "HND")
    ref.plan(indptr.cpu(), indices, last.cpu(), HEADS, HEADS, DIM, PAGE)  # ok: FC102
    assert torch.isfinite(out).all().item()  # ok: FC101
    assert (out - ref.run(q, kv)).abs().max().item() < 1e-2  # ok: FC101
    assert out.shape == q.shape  # ok: FC109
