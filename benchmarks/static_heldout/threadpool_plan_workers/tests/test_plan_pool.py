"""Plan-pool behaviour against a real FlashInfer install (needs a GPU)."""
from concurrent.futures import ThreadPoolExecutor

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

DEV = torch.device("cuda")


def _plan_on(w, indptr, indices, last_page_len):
    w.plan(indptr, indices, last_page_len, 64, 8, 128, 32)  # ok: FC102
    return w


def test_plans_from_two_threads_do_not_interfere():
    i32 = dict(dtype=torch.int32, device=DEV)
    a = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(128 << 20, dtype=torch.uint8, device=DEV), "HND")  # ok: FC106
    b = BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=DEV), "HND")  # ok: FC105
    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(_plan_on, a, torch.tensor([0, 2, 5], **i32), torch.arange(5, **i32), torch.ones(2, **i32))
        fb = pool.submit(_plan_on, b, torch.tensor([0, 1], **i32), torch.arange(1, **i32), torch.ones(1, **i32))
        fa.result()
        fb.result()
    assert a._plan_info != b._plan_info  # ok: FC103


def test_trtllm_decode_ignores_workspace_history():
    q = torch.randn(2, 64, 128, dtype=torch.bfloat16, device=DEV)
    kv = torch.randn(8, 2, 8, 32, 128, dtype=torch.bfloat16, device=DEV)
    tables = torch.arange(8, dtype=torch.int32, device=DEV).view(2, 4)
    lens = torch.tensor([70, 128], dtype=torch.int32, device=DEV)
    fresh = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)  # expect: FC105
    zeroed = torch.zeros(64 << 20, dtype=torch.uint8, device=DEV)  # ok: FC105
    reused = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)  # ok: FC105
    reused.zero_()
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, w, tables, lens, max_seq_len=128) for w in (fresh, zeroed, reused)]
    assert (outs[0] - outs[1]).abs().max().item() < 1e-2  # ok: FC101
    assert torch.equal(outs[1], outs[2])  # ok: FC109
