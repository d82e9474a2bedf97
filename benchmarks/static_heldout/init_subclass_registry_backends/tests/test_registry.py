"""Registry lookups and kernel-level checks of the workspaces the backends hand to FlashInfer."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from backends.kinds import Kind
from regattn import AttentionBackend

WS_BYTES = 64 * 1024 * 1024
BS, PAGES, PAGE, HEADS, DIM = 4, 2, 16, 8, 128
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _inputs():
    q = torch.randn(BS, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    return q, torch.randn(BS * PAGES, 2, HEADS, PAGE, DIM, dtype=torch.bfloat16, device="cuda")


def _trtllm(ws):
    tables = torch.arange(BS * PAGES, dtype=torch.int32, device="cuda").view(BS, PAGES)
    lens = torch.full((BS,), PAGES * PAGE, dtype=torch.int32, device="cuda")
    return trtllm_batch_decode_with_kv_cache(*_inputs(), ws, tables, lens, PAGES * PAGE, bmm1_scale=DIM**-0.5, bmm2_scale=1.0)


def test_every_kind_is_registered_under_its_name():
    assert Kind.TRTLLM.value is AttentionBackend._registry["trtllm-gen"]  # ok: FC109


@gpu
def test_trtllm_decode_fresh_workspace():
    _trtllm(torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda"))  # expect: FC105


@gpu
def test_trtllm_decode_zeroed_workspaces_agree():
    zeroed = torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared.zero_()
    filled = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    filled.fill_(0)
    torch.testing.assert_close(torch.stack([_trtllm(cleared), _trtllm(filled)]), _trtllm(zeroed).expand(2, -1, -1, -1))
    torch.cuda.synchronize()  # ok: FC101


@gpu
def test_fa2_plan_on_device_tensors_matches_host_plan():
    q, kv = _inputs()
    indptr = torch.arange(0, (BS + 1) * PAGES, PAGES, dtype=torch.int32, device="cuda")
    indices = torch.arange(BS * PAGES, dtype=torch.int32, device="cuda")
    last = torch.full((BS,), PAGE, dtype=torch.int32, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda"), "HND")  # ok: FC106
    w.plan(indptr, indices, last, HEADS, HEADS, DIM, PAGE)  # ok: FC102
    out = w.run(q, kv)
    assert w._plan_info is not None  # ok: FC103
    ref = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda"), "HND")  # ok: FC106
    ref.plan(indptr.cpu(), indices, last.cpu(), HEADS, HEADS, DIM, PAGE)
    assert out.isfinite().all().item()  # ok: FC101
    assert (out - ref.run(q, kv)).abs().max().item() < 1e-2  # ok: FC101
