import gc

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

from fincore.limits import ServeLimits
from finattn.backend import FlashInferAttn
from finrun.pages import PagePool

TEST_WS_BYTES = 32 * 1024 * 1024


def test_finalizer_returns_pages():
    limits = ServeLimits(num_layers=2, max_pages=1024)
    attn = FlashInferAttn(limits, torch.device("cuda"))
    pool = PagePool(1024, attn)
    state = pool.admit("r0", list(range(40)))
    before = len(pool.free)
    del state
    gc.collect()
    assert len(pool.free) > before  # ok: FC109
    assert attn.g_indices[:8].sum().item() == 0  # ok: FC101


def test_plan_with_device_indptr():
    ws = torch.zeros(TEST_WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device="cuda")
    w.plan(indptr, torch.arange(3, dtype=torch.int32, device="cuda"), torch.tensor([5, 9], dtype=torch.int32), 8, 8, 64, 16)  # ok: FC102


def test_trtllm_decode_workspace():
    limits = ServeLimits()
    q = torch.randn(2, 8, 64, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, 16, 8, 64, dtype=torch.bfloat16, device="cuda")
    tables = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4)
    lens = torch.tensor([33, 60], dtype=torch.int32, device="cuda")
    ws = torch.empty(limits.split_kv_bytes(), dtype=torch.uint8, device="cuda")  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 64)
    zeroed = torch.zeros(limits.split_kv_bytes(), dtype=torch.uint8, device="cuda")  # ok: FC105
    ref = trtllm_batch_decode_with_kv_cache(q, kv, zeroed, tables, lens, 64)
    fa2_ws = torch.empty(limits.split_kv_bytes(), dtype=torch.uint8, device="cuda")  # ok: FC105
    BatchDecodeWithPagedKVCacheWrapper(fa2_ws, "NHD")
    torch.testing.assert_close(out, ref)
