import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from proxyserve import PAGE_SIZE, TracedWrapper


def test_proxy_forwards_plan_and_counts_calls():
    ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    ws.zero_()
    proxy = TracedWrapper(BatchDecodeWithPagedKVCacheWrapper(ws, "HND", backend="trtllm-gen"), "t")
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    proxy.plan(indptr, indptr[:2], torch.ones(2, dtype=torch.int32, device="cuda"), 32, 8, 128, PAGE_SIZE)  # ok: FC102
    assert proxy.calls["plan"] == 1 and indptr[-1].item() == 2  # ok: FC109
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(2, 2, 8, PAGE_SIZE, 128, dtype=torch.bfloat16, device="cuda")
    ws2 = torch.zeros(32 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws2, indptr[:2].view(2, 1), indptr[1:], PAGE_SIZE, 128 ** -0.5, 1.0)
    assert not out.isnan().any().item()  # ok: FC101
    print(out.float().norm().cpu())  # ok: FC101
