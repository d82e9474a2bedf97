import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache


def test_prefill_plan_and_trtllm_decode():
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    qo = torch.tensor([0, 4], dtype=torch.int32, device="cuda")
    pages = torch.arange(4, dtype=torch.int32, device="cuda")
    BatchPrefillWithPagedKVCacheWrapper(ws, "NHD").plan(qo, qo, pages, torch.tensor([1], dtype=torch.int32), 8, 8, 128, 1)
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    tables, lens = pages.view(1, 4).repeat(2, 1), torch.full((2,), 64, dtype=torch.int32, device="cuda")
    fresh = torch.empty(2 * 32 * 4096, dtype=torch.uint8, device="cuda")  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(q, kv, fresh, tables, lens, 64)
    zeroed = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    ref = trtllm_batch_decode_with_kv_cache(q, kv, zeroed, tables, lens, 64)
    counters = torch.zeros(2 * 32 * 4096, dtype=torch.uint8, device="cuda")  # ok: FC105
    again = trtllm_batch_decode_with_kv_cache(q, kv, counters, tables, lens, 64)
    assert out.shape == ref.shape == again.shape  # ok: FC109
    assert (out - ref).abs().max().item() < 1e-2  # ok: FC101
    torch.testing.assert_close(again, ref)
